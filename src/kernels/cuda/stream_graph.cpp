// ops::StreamGraph (kernels/device.h): stream capture of the compute stream into a CUDA graph.
#include <cuda_runtime_api.h>

#include <map>
#include <string>
#include <vector>

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

std::string StreamGraph::census() const {
  if (!impl_->graph) return "no graph captured";
  size_t n = 0;
  MT_CUDA_CHECK(cudaGraphGetNodes(impl_->graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n) MT_CUDA_CHECK(cudaGraphGetNodes(impl_->graph, nodes.data(), &n));
  std::map<std::string, int64_t> kinds;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType t{};
    MT_CUDA_CHECK(cudaGraphNodeGetType(node, &t));
    const char* name = "other";
    switch (t) {
      case cudaGraphNodeTypeKernel: name = "kernel"; break;
      case cudaGraphNodeTypeMemcpy: name = "memcpy"; break;
      case cudaGraphNodeTypeMemset: name = "memset"; break;
      case cudaGraphNodeTypeMemAlloc: name = "mem-alloc"; break;
      case cudaGraphNodeTypeMemFree: name = "mem-free"; break;
      case cudaGraphNodeTypeEventRecord: name = "event-record"; break;
      case cudaGraphNodeTypeWaitEvent: name = "event-wait"; break;
      case cudaGraphNodeTypeEmpty: name = "empty"; break;
      default: break;
    }
    ++kinds[name];
  }
  size_t e = 0;
  MT_CUDA_CHECK(cudaGraphGetEdges(impl_->graph, nullptr, nullptr, nullptr, &e));
  std::vector<cudaGraphNode_t> from(e), to(e);
  std::vector<cudaGraphEdgeData> data(e);
  if (e) MT_CUDA_CHECK(cudaGraphGetEdges(impl_->graph, from.data(), to.data(), data.data(), &e));
  int64_t programmatic = 0;
  for (size_t i = 0; i < e; ++i) programmatic += data[i].type == cudaGraphDependencyTypeProgrammatic ? 1 : 0;
  std::string s = std::to_string(n) + " nodes:";
  for (const auto& [k, c] : kinds) s += " " + std::to_string(c) + " " + k + ",";
  s += " " + std::to_string(programmatic) + " of " + std::to_string(e) + " edges programmatic";
  return s;
}

int64_t DeviceArena::tally(const std::function<void()>& f) {
  cuda::CudaAllocator& a = *cuda::context().alloc;
  a.begin_tally();
  try {
    f();
  } catch (...) {
    a.end_tally();
    throw;
  }
  return static_cast<int64_t>(a.end_tally());
}

DeviceArena::DeviceArena(int64_t bytes) : bytes_(bytes) {
  MT_CHECK(bytes >= 0, "DeviceArena of {} bytes", bytes);
  // Plain cudaMalloc (not the pool): made before the capture, it is no node of the graph.
  if (bytes > 0) MT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&base_), static_cast<size_t>(bytes)));
}

DeviceArena::~DeviceArena() {
  if (!base_) return;
  // Destructors do not throw: with the context already gone (process teardown) there is no
  // allocator to tell, and the driver takes the memory back with the process.
  try {
    cuda::context().alloc->release_arena(base_);
  } catch (const Error&) {
    return;
  }
  // cudaFree waits for the device: no replay still reads the memory.
  if (cudaFree(base_) != cudaSuccess) cudaGetLastError();
}

void DeviceArena::serve(const std::function<void()>& f) {
  cuda::CudaAllocator& a = *cuda::context().alloc;
  a.serve_from(base_, static_cast<size_t>(bytes_));
  auto done = [&] {
    used_ = static_cast<int64_t>(a.arena_used());
    misses_ = static_cast<int64_t>(a.arena_misses());
    a.serve_from(nullptr, 0);  // the range stays registered: its tensors' frees stay no-ops
  };
  try {
    f();
  } catch (...) {
    done();
    throw;
  }
  done();
}

}  // namespace mt::ops
