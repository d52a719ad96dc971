#pragma once
// Flash attention through cuDNN's fused attention engines (cuDNN 9 backend graph API), the
// second implementation behind cuda::attention_forward/backward (bf16) next to our own kernels;
// --attention-backend picks between them (ops_cuda.h). Same tensors and semantics as those:
// q [B,Hq,S,D], k/v [B,Hkv,S,D] bf16 contiguous, lse fp32 [B,Hq,S] = natural-log logsumexp of
// the scaled, masked scores (cuDNN's "Stats"), dq/dk/dv written. O and dO may instead live in
// Megatron's sequence-first rows (AttnLayout::Rows), which cuDNN reads and writes through strides.
//
// One graph + execution plan per (device, shape, scale, causal, direction, determinism, layout), built
// on first use and cached; later calls only bind pointers and launch (no host sync, workspace
// from the stream-ordered pool). The backward defaults to cuDNN's deterministic variant.
//
// Diagnosing a failure: the error text carries cuDNN's own reason per tried engine config; for
// more, run with CUDNN_LOGLEVEL_DBG=3 CUDNN_LOGDEST_DBG=stderr.
#include <cuda_runtime_api.h>

#include <string>

#include "kernels/cuda/ops_cuda.h"

namespace mt::cuda {

// Where O (the forward's output, the backward's input) and dO live; q, k, v, their gradients
// and lse are the same in both. Heads: [B,Hq,S,D] contiguous, like q. Rows: the [S*B, Hq*D]
// rows in (s, b) order that linear_proj consumes (ops::heads_to_rows's output), element
// (b,h,s,d) at ((s*B + b)*Hq + h)*D + d, i.e. strides {Hq*D, D, B*Hq*D, 1} for [b,h,s,d]:
// cuDNN then saves the layout copy around the core (Transformer Engine's "sbhd").
enum class AttnLayout { Heads, Rows };

// True when this build links cuDNN (MT_HAVE_CUDNN).
bool cudnn_attention_compiled();
// The cuDNN version loaded at run time (e.g. 91900), 0 without cuDNN.
long cudnn_runtime_version();

// Static support check (no graph is built): bf16 storage is implied by the callers; no dropout,
// D a multiple of 8 up to 128, Hq a multiple of Hkv, cuDNN present and recent enough, and the
// sequence length restrictions of the loaded cuDNN version. `why` (optional) gets the reason.
bool cudnn_attention_supported(const ops::AttentionShape& p, std::string* why = nullptr);

// Builds (once, cached) the graph and plan for this call shape on the current device; returns ""
// when it is ready, else the reason it could not be built (also cached: a failing shape is not
// retried). Throws only for CUDA errors. Tests use it to print the cuDNN reason on failure.
std::string cudnn_attention_prepare(const ops::AttentionShape& p, bool backward, bool deterministic = true,
                                    AttnLayout layout = AttnLayout::Heads);

// Run on stream s; throw mt::Error (with the reason from cudnn_attention_prepare and the shape)
// when the shape is unsupported or the graph cannot be built.
void cudnn_attention_forward(const ops::AttentionShape& p, const bf16* q, const bf16* k, const bf16* v, bf16* out,
                             float* lse, cudaStream_t s, AttnLayout layout = AttnLayout::Heads);
// deterministic = false allows cuDNN's faster backward that accumulates dQ with atomics
// (run-to-run bits may differ); training uses the default.
void cudnn_attention_backward(const ops::AttentionShape& p, const bf16* q, const bf16* k, const bf16* v,
                              const bf16* out, const float* lse, const bf16* dout, bf16* dq, bf16* dk, bf16* dv,
                              cudaStream_t s, bool deterministic = true, AttnLayout layout = AttnLayout::Heads);

// The policy behind the bf16 entry points: whether this call goes to cuDNN under the current
// attention_backend(). Flash: never. Fused: always (an unsupported shape or a failed build then
// throws mt::Error from here, with the reason). Auto: when supported, all pointers are 16-byte
// aligned and the graph builds; a failed build logs one warning line per shape on stderr.
// Rows: the same, except that a rows graph that does not build is never an error (warned once):
// the caller then runs the heads layout and a copy, which is still cuDNN under fused.
bool attention_use_cudnn(const ops::AttentionShape& p, bool backward, const void* const* ptrs, int nptrs,
                         AttnLayout layout = AttnLayout::Heads);

// ---- Packed documents (--reset-attention-mask) on cuDNN: every document of the batch is one
// cuDNN sequence (a ragged graph: per-document lengths as a padding mask and per-document
// element offsets, so nothing is copied into a padded layout), causal inside it when p.causal.
// Two memory layouts for the graph's tensors (VarlenLayout): Heads reads and writes our
// [B,H,S,D] tensors in place (each head of a document a contiguous run); Tokens copies them to
// and from token-major [B*S,H,D] (the packed "THD" layout of cuDNN's docs; lse too), costing
// one transpose per tensor. The graph is sized by buckets (VarlenBuckets) so that batches with other
// document counts reuse it; the unused documents have length 0 and cuDNN skips them.
// Eligible calls (cudnn_varlen_supported): p.cu_seqlens with its host copy p.cu_seqlens_host,
// whole samples (no chunk positions, Sk = seq_total = S), no dropout, documents inside samples,
// offsets within int32, and what cudnn_attention_supported asks of the plain graph.
enum class VarlenLayout { None, Heads, Tokens };
const char* varlen_layout_name(VarlenLayout l);
// The layout the ragged graphs use (process-wide). None (the default): Heads where its graph
// builds, else Tokens. Tests and cuda_ops_bench force one to compare them.
void set_varlen_layout(VarlenLayout l);
VarlenLayout varlen_layout();
struct VarlenBuckets {
  int64_t docs;     // the document count rounded up to a power of two
  int64_t max_len;  // the longest document rounded up to a power of two, at least 128
  int64_t real_docs, real_max_len;
  double mean_len;
};
VarlenBuckets varlen_buckets(const ops::AttentionShape& p);  // needs p.cu_seqlens_host
// The ragged graph's own shape: B = vb.docs documents of at most S = vb.max_len tokens.
ops::AttentionShape varlen_view(const ops::AttentionShape& p, const VarlenBuckets& vb);
bool cudnn_varlen_supported(const ops::AttentionShape& p, std::string* why = nullptr);
// As cudnn_attention_prepare, for the ragged graph of this call's buckets; `chosen` (optional)
// gets the layout that will run.
std::string cudnn_attention_varlen_prepare(const ops::AttentionShape& p, bool backward, bool deterministic = true,
                                           VarlenLayout* chosen = nullptr);
void cudnn_attention_varlen_forward(const ops::AttentionShape& p, const bf16* q, const bf16* k, const bf16* v,
                                    bf16* out, float* lse, cudaStream_t s);
void cudnn_attention_varlen_backward(const ops::AttentionShape& p, const bf16* q, const bf16* k, const bf16* v,
                                     const bf16* out, const float* lse, const bf16* dout, bf16* dq, bf16* dk, bf16* dv,
                                     cudaStream_t s, bool deterministic = true);
// The policy for packed documents (the ranged tensor-core kernels are the alternative). Flash:
// never. Fused: whenever eligible (a graph that does not build is then an error naming the
// flag); calls that are not eligible (context-parallel chunks, dropout, no host copy of the
// documents) keep the ranged kernels as before. Auto: varlen_auto_prefers_cudnn and a graph
// that builds (else the ranged kernels, one warning per shape).
bool attention_use_cudnn_varlen(const ops::AttentionShape& p, bool backward, const void* const* ptrs, int nptrs);
// Auto's measured rule (attention_cudnn.cpp, its constants and the numbers behind them).
bool varlen_auto_prefers_cudnn(const ops::AttentionShape& p);

// The ragged graph's device inputs (attention_varlen.cu): from the device p.cu_seqlens, `out`
// gets the document lengths [docs], then the element offsets of Q/O, of K/V and of Stats in
// `layout`'s memory, [docs + 1] each; documents past p.num_segments get length 0.
// varlen_descriptor_ints(docs) ints in all. Stream-ordered.
inline int64_t varlen_descriptor_ints(int64_t docs) { return 4 * docs + 3; }
void varlen_descriptors(const ops::AttentionShape& p, int64_t docs, VarlenLayout layout, int32_t* out, cudaStream_t s);
// Tokens layout copies: [B, H, S, row] <-> [B, S, H, row], row_bytes per (b, h, s) row (a
// multiple of 4: bf16 heads of D >= 2, or one fp32 lse). Stream-ordered.
void varlen_transpose(const void* src, void* dst, int64_t B, int64_t H, int64_t S, int64_t row_bytes, bool to_tokens,
                      cudaStream_t s);

}  // namespace mt::cuda
