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

std::string shape_str(const AttnParams& p) {
  return fmt::format("B={} Hq={} Hkv={} S={} D={} causal={} dropout={}", p.B, p.Hq, p.Hkv, p.S, p.D, p.causal ? 1 : 0,
                     p.dropout_p);
}

bool all_aligned16(const void* const* ptrs, int n) {
  for (int i = 0; i < n; ++i)
    if (reinterpret_cast<uintptr_t>(ptrs[i]) & 15u) return false;
  return true;
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

bool attention_use_cudnn(const AttnParams& p, bool backward, const void* const* ptrs, int nptrs) {
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
    const std::string err = cudnn_attention_prepare(p, backward, attention_deterministic());
    if (!err.empty()) fail("--attention-backend fused: {}", err);
    return true;
  }
  if (!all_aligned16(ptrs, nptrs) || !cudnn_attention_supported(p)) return false;
  const std::string err = cudnn_attention_prepare(p, backward, attention_deterministic());
  if (err.empty()) return true;
  // Auto falls back to our kernels; say so once per shape and direction (the failure is cached).
  static std::mutex mu;
  static std::set<std::string> warned;
  const std::string key = std::string(dir) + " " + shape_str(p) + fmt::format(" scale={}", p.scale);
  std::lock_guard<std::mutex> lock(mu);
  if (warned.insert(key).second)
    log_warn("attention backend auto: cuDNN fused attention unavailable for {}, using the flash kernels: {}", key, err);
  return false;
}

}  // namespace mt::cuda

#ifndef MT_HAVE_CUDNN

namespace mt::cuda {

bool cudnn_attention_compiled() { return false; }
long cudnn_runtime_version() { return 0; }

bool cudnn_attention_supported(const AttnParams&, std::string* why) {
  if (why) *why = "this build has no cuDNN (cudnn.h / libcudnn were not found when configuring CMake)";
  return false;
}

std::string cudnn_attention_prepare(const AttnParams&, bool, bool) {
  return "this build has no cuDNN (cudnn.h / libcudnn were not found when configuring CMake)";
}

void cudnn_attention_forward(const AttnParams& p, const bf16*, const bf16*, const bf16*, bf16*, float*, cudaStream_t) {
  fail("cuDNN attention forward ({}): {}", shape_str(p), cudnn_attention_prepare(p, false, true));
}

void cudnn_attention_backward(const AttnParams& p, const bf16*, const bf16*, const bf16*, const bf16*, const float*,
                              const bf16*, bf16*, bf16*, bf16*, cudaStream_t, bool) {
  fail("cuDNN attention backward ({}): {}", shape_str(p), cudnn_attention_prepare(p, true, true));
}

}  // namespace mt::cuda

#endif  // !MT_HAVE_CUDNN
