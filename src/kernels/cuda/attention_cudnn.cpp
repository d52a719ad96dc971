// cuDNN fused flash attention (see attention_cudnn.h): the backend selection, the support
// check, and (with MT_HAVE_CUDNN) the graphs, their cache and their execution.
#include "kernels/cuda/attention_cudnn.h"

#include <atomic>
#include <cstdint>
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

}  // namespace mt::cuda

#endif  // !MT_HAVE_CUDNN
