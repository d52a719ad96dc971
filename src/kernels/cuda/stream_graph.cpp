// ops::StreamGraph (kernels/device.h): stream capture of the compute stream into a CUDA graph.
#include <cuda_runtime_api.h>

#include "core/error.h"
#include "kernels/cuda/context.h"
#include "kernels/device.h"

namespace mt::ops {

struct StreamGraph::Impl {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~Impl() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
};

StreamGraph::StreamGraph() : impl_(std::make_unique<Impl>()) {}
StreamGraph::~StreamGraph() = default;

bool StreamGraph::ready() const { return impl_->exec != nullptr; }

void StreamGraph::capture(const std::function<void()>& f) {
  MT_CHECK(!ready(), "a StreamGraph captures once");
  const cudaStream_t s = cuda::compute_stream();
  MT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  // Ends the capture whatever happens, so that the stream is usable again after a failure.
  auto end = [&](bool ok) {
    cudaGraph_t g = nullptr;
    const cudaError_t e = cudaStreamEndCapture(s, &g);
    if (!ok || e != cudaSuccess || !g) {
      if (g) cudaGraphDestroy(g);
      cudaGetLastError();  // the capture's error is not sticky: clear it
      return false;
    }
    impl_->graph = g;
    return true;
  };
  try {
    f();
  } catch (const Error& e) {
    end(false);
    fail("CUDA graph capture failed: {}", e.what());
  }
  if (!end(true)) fail("CUDA graph capture failed: the captured work used an operation a capture refuses");
  const cudaError_t e = cudaGraphInstantiate(&impl_->exec, impl_->graph, 0);
  if (e != cudaSuccess) {
    cudaGetLastError();
    impl_->exec = nullptr;
    fail("CUDA graph instantiation failed: {}", cudaGetErrorString(e));
  }
}

void StreamGraph::launch() {
  MT_CHECK(ready(), "StreamGraph::launch before a capture");
  MT_CUDA_CHECK(cudaGraphLaunch(impl_->exec, cuda::compute_stream()));
}

}  // namespace mt::ops
