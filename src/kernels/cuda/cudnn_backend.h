#pragma once
// A thin RAII layer over cuDNN's backend ("graph") C API: one owned cudnnBackendDescriptor_t
// with typed setters that throw mt::Error naming the attribute and cuDNN's own reason
// (cudnnGetLastErrorString). Only compiled where cuDNN was found (MT_HAVE_CUDNN).
//
// cuDNN explains its rejections in more detail through its log:
//   CUDNN_LOGLEVEL_DBG=3 CUDNN_LOGDEST_DBG=stderr ./test_kernels ...
// (level 2 = warnings and errors, 3 = also info; CUDNN_LOGDEST_DBG may be a file name).
#include <cudnn.h>

#include <cstdint>
#include <string>
#include <vector>

namespace mt::cuda::cudnn {

// cudnnGetLastErrorString (the reason behind the last failed call on this thread; may be empty).
std::string last_error();
// "CUDNN_STATUS_... (<last error>)".
std::string describe(cudnnStatus_t st);
// Throws mt::Error "cuDNN <what> failed: <describe(st)>" unless st is success.
void check(cudnnStatus_t st, const char* what);

class Desc {
 public:
  Desc() = default;
  explicit Desc(cudnnBackendDescriptorType_t type);
  ~Desc();
  Desc(Desc&& o) noexcept : d_(o.d_) { o.d_ = nullptr; }
  Desc& operator=(Desc&& o) noexcept;
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;

  cudnnBackendDescriptor_t get() const { return d_; }

  Desc& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count, const void* values);
  Desc& set_i64(cudnnBackendAttributeName_t name, int64_t v) { return set(name, CUDNN_TYPE_INT64, 1, &v); }
  Desc& set_i64s(cudnnBackendAttributeName_t name, const std::vector<int64_t>& v) {
    return set(name, CUDNN_TYPE_INT64, static_cast<int64_t>(v.size()), v.data());
  }
  Desc& set_bool(cudnnBackendAttributeName_t name, bool v) { return set(name, CUDNN_TYPE_BOOLEAN, 1, &v); }
  Desc& set_dtype(cudnnBackendAttributeName_t name, cudnnDataType_t v) {
    return set(name, CUDNN_TYPE_DATA_TYPE, 1, &v);
  }
  Desc& set_desc(cudnnBackendAttributeName_t name, const Desc& d) {
    cudnnBackendDescriptor_t raw = d.get();
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw);
  }
  Desc& set_handle(cudnnBackendAttributeName_t name, cudnnHandle_t h) { return set(name, CUDNN_TYPE_HANDLE, 1, &h); }

  // Throws with `what` and cuDNN's reason.
  void finalize(const char* what);
  // For callers that try alternatives (engine configs): returns the status instead.
  cudnnStatus_t try_finalize() { return cudnnBackendFinalize(d_); }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

}  // namespace mt::cuda::cudnn
