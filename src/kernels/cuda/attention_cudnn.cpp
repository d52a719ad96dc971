// cuDNN fused flash attention (see attention_cudnn.h): the backend selection, the support
// check, and (with MT_HAVE_CUDNN) the graphs, their cache and their execution.
#include "kernels/cuda/attention_cudnn.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <mutex>
#include <set>

#include "core/error.h"
#include "core/log.h"

namespace mt::cuda {

namespace {

std::atomic<AttentionBackend> g_backend{AttentionBackend::Auto};
std::atomic<bool> g_deterministic{true};

std::string shape_str(const ops::AttentionShape& p) {
  return fmt::format("B={} Hq={} Hkv={} S={} D={} causal={} dropout={}", p.B, p.Hq, p.Hkv, p.S, p.D, p.causal ? 1 : 0,
                     p.dropout_p);
}

bool all_aligned16(const void* const* ptrs, int n) {
  for (int i = 0; i < n; ++i)
    if (reinterpret_cast<uintptr_t>(ptrs[i]) & 15u) return false;
  return true;
}

// The fallback after a failed graph build, said once per shape, direction and layout (the
// failure is cached, so later calls fall back silently).
void warn_fallback_once(const ops::AttentionShape& p, const char* dir, AttnLayout layout, const std::string& err) {
  static std::mutex mu;
  static std::set<std::string> warned;
  const bool rows = layout == AttnLayout::Rows;
  const std::string key = fmt::format("{} {} scale={} layout={}", dir, shape_str(p), p.scale, rows ? "rows" : "heads");
  std::lock_guard<std::mutex> lock(mu);
  if (warned.insert(key).second)
    log_warn("attention backend: cuDNN fused attention unavailable for {}, {}: {}", key,
             rows ? "using the heads layout and a copy" : "using the flash kernels", err);
}

}  // namespace

void set_attention_backend(AttentionBackend b) { g_backend.store(b); }
AttentionBackend attention_backend() { return g_backend.load(); }
void set_attention_deterministic(bool d) { g_deterministic.store(d); }
bool attention_deterministic() { return g_deterministic.load(); }

AttentionBackend attention_backend_from_name(const std::string& name) {
  if (name == "auto") return AttentionBackend::Auto;
  if (name == "flash") return AttentionBackend::Flash;
  if (name == "fused") return AttentionBackend::Fused;
  fail("attention backend '{}' does not exist here; the backends are auto, flash (own kernels) and fused (cuDNN)",
       name);
}

bool attention_use_cudnn(const ops::AttentionShape& p, bool backward, const void* const* ptrs, int nptrs,
                         AttnLayout layout) {
  const AttentionBackend b = attention_backend();
  if (b == AttentionBackend::Flash) return false;
  const char* dir = backward ? "backward" : "forward";
  std::string why;
  if (b == AttentionBackend::Fused) {
    if (!cudnn_attention_supported(p, &why))
      fail("--attention-backend fused: cuDNN cannot run attention {} ({}): {}; use --attention-backend flash or auto",
           dir, shape_str(p), why);
    if (!all_aligned16(ptrs, nptrs))
      fail("--attention-backend fused: cuDNN attention {} needs 16-byte aligned tensors ({})", dir, shape_str(p));
  } else if (!all_aligned16(ptrs, nptrs) || !cudnn_attention_supported(p)) {
    return false;
  }
  const std::string err = cudnn_attention_prepare(p, backward, attention_deterministic(), layout);
  if (err.empty()) return true;
  // Rows only saves a copy: when its graph alone fails, the caller runs the heads layout and
  // copies, which is still cuDNN under fused. A failing heads graph is an error under fused.
  if (layout == AttnLayout::Heads && b == AttentionBackend::Fused) fail("--attention-backend fused: {}", err);
  warn_fallback_once(p, dir, layout, err);
  return false;
}

// ---- Packed documents

namespace {

// cuDNN below this runs the plain graphs only: the ragged graph (ragged Stats, padding mask with
// GQA in the backward) is taken from 9.6 on, where cudnn-frontend's ragged backward is complete.
constexpr long kVarlenMinCudnn = 90600;

// --attention-backend auto for packed documents: cuDNN's ragged graph when the documents are
// long enough on average (one threshold for the deterministic backward, training's default,
// one for --nondeterministic-attention) and the sample long enough, else the ranged
// tensor-core kernels. Measured (`cuda_ops_bench --quick --only=varlen`, llama-1.5b heads, H200,
// session 13, fwd+bwd TFLOP/s, ranged / cuDNN heads layout deterministic / non-deterministic):
//   4k uniform 145 / 52 / 205; 4k long 133 / 73 / 183; 8k uniform 133 / 41 / 175;
//   8k long 147 / 92 / 250; 32k uniform 137 / 45 / 209; 32k long 163 / refused (64.5 GiB
//   workspace) / 338; 32k short documents (mean 596) 97 / 66 / 122.
// cuDNN's deterministic backward is 2-4x slower than the ranged kernels everywhere: never. Its
// non-deterministic backward is faster in every case measured, from 596-token documents on.
constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
constexpr int64_t kVarlenCudnnMinMeanDoc = kNever;
constexpr int64_t kVarlenCudnnMinMeanDocNondet = 0;
constexpr int64_t kVarlenCudnnMinSample = 0;

int64_t pow2_at_least(int64_t x) {
  int64_t r = 1;
  while (r < x) r *= 2;
  return r;
}

}  // namespace

namespace {
// None: Heads (in place) where its graph builds, else Tokens (copies). To be confirmed by the
// GPU tests (GpuCudnnVarlen.*LayoutMatchesCpuAndRangedKernels): should Heads build yet read
// our strides wrongly on some cuDNN version, this becomes Tokens.
constexpr VarlenLayout kVarlenDefaultLayout = VarlenLayout::None;
std::atomic<VarlenLayout> g_varlen_layout{kVarlenDefaultLayout};
}  // namespace

const char* varlen_layout_name(VarlenLayout l) {
  return l == VarlenLayout::Heads ? "heads" : l == VarlenLayout::Tokens ? "tokens" : "none";
}
void set_varlen_layout(VarlenLayout l) { g_varlen_layout.store(l); }
VarlenLayout varlen_layout() { return g_varlen_layout.load(); }

VarlenBuckets varlen_buckets(const ops::AttentionShape& p) {
  MT_CHECK(p.cu_seqlens_host && p.num_segments > 0, "varlen_buckets: no host cu_seqlens");
  int64_t longest = 0;
  for (int64_t i = 0; i < p.num_segments; ++i)
    longest = std::max<int64_t>(longest, p.cu_seqlens_host[i + 1] - p.cu_seqlens_host[i]);
  // Powers of two keep the number of graphs small (each costs a build of up to a second) at
  // the price of idle grid slots for the unused documents and rows, which exit at once.
  return {pow2_at_least(p.num_segments), std::max<int64_t>(128, pow2_at_least(longest)), p.num_segments, longest,
          static_cast<double>(p.cu_seqlens_host[p.num_segments] - p.cu_seqlens_host[0]) /
              static_cast<double>(p.num_segments)};
}

ops::AttentionShape varlen_view(const ops::AttentionShape& p, const VarlenBuckets& vb) {
  ops::AttentionShape c{vb.docs, p.Hq, p.Hkv, vb.max_len, p.D, p.scale};
  c.causal = p.causal;
  return c;
}

bool cudnn_varlen_supported(const ops::AttentionShape& p, std::string* why) {
  auto no = [&](std::string r) {
    if (why) *why = std::move(r);
    return false;
  };
  if (!p.cu_seqlens || !p.cu_seqlens_host || p.num_segments <= 0)
    return no("the call has no packed documents with a host copy of cu_seqlens");
  if (p.q_pos != 0 || p.k_pos != 0 || p.keys() != p.S || p.total() != p.S)
    return no("context-parallel chunks run on the ranged kernels");
  if (p.dropout_p > 0.f) return no("attention dropout is not supported by the cuDNN path");
  if (p.B * std::max(p.Hq, p.Hkv) * p.S * p.D >= (int64_t{1} << 31))
    return no(fmt::format("B*Hq*S*D = {} does not fit the int32 ragged offsets", p.B * p.Hq * p.S * p.D));
  const int32_t* cu = p.cu_seqlens_host;
  if (cu[0] != 0 || cu[p.num_segments] != p.B * p.S) return no("cu_seqlens does not cover the batch");
  for (int64_t i = 0; i < p.num_segments; ++i)
    if (cu[i + 1] < cu[i] || (cu[i + 1] > cu[i] && cu[i] / p.S != (cu[i + 1] - 1) / p.S))
      return no(fmt::format("document {} [{}, {}) is not inside one sample", i, cu[i], cu[i + 1]));
  if (cudnn_runtime_version() < kVarlenMinCudnn)
    return no(fmt::format("cuDNN {} is loaded; packed documents on cuDNN need {}+", cudnn_runtime_version(),
                          kVarlenMinCudnn));
  return cudnn_attention_supported(varlen_view(p, varlen_buckets(p)), why);
}

bool varlen_auto_prefers_cudnn(const ops::AttentionShape& p) {
  const int64_t min_mean = attention_deterministic() ? kVarlenCudnnMinMeanDoc : kVarlenCudnnMinMeanDocNondet;
  if (min_mean == kNever || p.S < kVarlenCudnnMinSample) return false;
  return varlen_buckets(p).mean_len >= static_cast<double>(min_mean);
}

bool attention_use_cudnn_varlen(const ops::AttentionShape& p, bool backward, const void* const* ptrs, int nptrs) {
  const AttentionBackend b = attention_backend();
  if (b == AttentionBackend::Flash || !p.cu_seqlens_host || p.num_segments <= 0) return false;
  // The rule first: it is cheap, and under auto's default it says no to every call.
  if (b == AttentionBackend::Auto && !varlen_auto_prefers_cudnn(p)) return false;
  if (!cudnn_varlen_supported(p) || !all_aligned16(ptrs, nptrs)) return false;
  const std::string err = cudnn_attention_varlen_prepare(p, backward, attention_deterministic());
  if (err.empty()) return true;
  if (b == AttentionBackend::Fused)
    fail("--attention-backend fused: packed documents ({} documents): {}; use --attention-backend auto or flash",
         p.num_segments, err);
  warn_fallback_once(p, backward ? "packed-document backward" : "packed-document forward", AttnLayout::Heads, err);
  return false;
}

}  // namespace mt::cuda

#ifndef MT_HAVE_CUDNN

namespace mt::cuda {

bool cudnn_attention_compiled() { return false; }
long cudnn_runtime_version() { return 0; }

bool cudnn_attention_supported(const ops::AttentionShape&, std::string* why) {
  if (why) *why = "this build has no cuDNN (cudnn.h / libcudnn were not found when configuring CMake)";
  return false;
}

std::string cudnn_attention_prepare(const ops::AttentionShape&, bool, bool, AttnLayout) {
  return "this build has no cuDNN (cudnn.h / libcudnn were not found when configuring CMake)";
}

void cudnn_attention_forward(const ops::AttentionShape& p, const bf16*, const bf16*, const bf16*, bf16*, float*,
                             cudaStream_t, AttnLayout) {
  fail("cuDNN attention forward ({}): {}", shape_str(p), cudnn_attention_prepare(p, false, true));
}

void cudnn_attention_backward(const ops::AttentionShape& p, const bf16*, const bf16*, const bf16*, const bf16*,
                              const float*, const bf16*, bf16*, bf16*, bf16*, cudaStream_t, bool, AttnLayout) {
  fail("cuDNN attention backward ({}): {}", shape_str(p), cudnn_attention_prepare(p, true, true));
}

std::string cudnn_attention_varlen_prepare(const ops::AttentionShape&, bool, bool, VarlenLayout*) {
  return "this build has no cuDNN (cudnn.h / libcudnn were not found when configuring CMake)";
}

void cudnn_attention_varlen_forward(const ops::AttentionShape& p, const bf16*, const bf16*, const bf16*, bf16*, float*,
                                    cudaStream_t) {
  fail("cuDNN packed-document attention forward ({}): {}", shape_str(p), cudnn_attention_varlen_prepare(p, false));
}

void cudnn_attention_varlen_backward(const ops::AttentionShape& p, const bf16*, const bf16*, const bf16*, const bf16*,
                                     const float*, const bf16*, bf16*, bf16*, bf16*, cudaStream_t, bool) {
  fail("cuDNN packed-document attention backward ({}): {}", shape_str(p), cudnn_attention_varlen_prepare(p, true));
}

}  // namespace mt::cuda

#endif  // !MT_HAVE_CUDNN
