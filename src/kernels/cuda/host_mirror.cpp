// HostMirror's CUDA side (kernels/host_mirror_gpu.h).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "kernels/cuda/context.h"
#include "kernels/host_mirror_gpu.h"

namespace mt::ops {
namespace {

class CudaHostMirror final : public HostMirror::Gpu {
 public:
  ~CudaHostMirror() override {
    if (event_) cudaEventDestroy(event_);
    if (host_) cudaFreeHost(host_);
  }

  void start(const std::vector<Tensor>& srcs, size_t total) override {
    if (total > capacity_) {
      if (pending_) wait_only();  // the old buffer may still be written to
      if (host_) MT_CUDA_CHECK(cudaFreeHost(host_));
      host_ = nullptr;
      MT_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host_), total * sizeof(float), cudaHostAllocDefault));
      capacity_ = total;
    }
    if (!event_) MT_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    const cudaStream_t s = cuda::compute_stream();
    size_t at = 0;
    for (const Tensor& t : srcs) {
      if (t.numel() > 0)
        MT_CUDA_CHECK(cudaMemcpyAsync(host_ + at, t.raw(), t.nbytes(), cudaMemcpyDeviceToHost, s));
      at += static_cast<size_t>(t.numel());
    }
    MT_CUDA_CHECK(cudaEventRecord(event_, s));
    size_ = total;
    pending_ = true;
  }

  bool pending() const override { return pending_; }

  void wait(std::vector<float>& out) override {
    wait_only();
    out.assign(host_, host_ + size_);
  }

 private:
  void wait_only() {
    MT_CUDA_CHECK(cudaEventSynchronize(event_));
    pending_ = false;
  }

  float* host_ = nullptr;
  size_t capacity_ = 0, size_ = 0;
  cudaEvent_t event_ = nullptr;
  bool pending_ = false;
};

}  // namespace

std::unique_ptr<HostMirror::Gpu> make_host_mirror_gpu() { return std::make_unique<CudaHostMirror>(); }

}  // namespace mt::ops
