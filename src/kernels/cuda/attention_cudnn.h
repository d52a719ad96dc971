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

}  // namespace mt::cuda
