// RAII backend descriptors for cuDNN's graph API (see cudnn_backend.h).
#ifdef MT_HAVE_CUDNN

#include "kernels/cuda/cudnn_backend.h"

#include "core/error.h"

namespace mt::cuda::cudnn {

std::string last_error() {
  char buf[4096] = {0};
  cudnnGetLastErrorString(buf, sizeof buf);
  return buf;
}

std::string describe(cudnnStatus_t st) {
  std::string s = cudnnGetErrorString(st);
  const std::string why = last_error();
  if (!why.empty()) s += " (" + why + ")";
  return s;
}

void check(cudnnStatus_t st, const char* what) {
  if (st != CUDNN_STATUS_SUCCESS) fail("cuDNN {} failed: {}", what, describe(st));
}

Desc::Desc(cudnnBackendDescriptorType_t type) {
  check(cudnnBackendCreateDescriptor(type, &d_), "cudnnBackendCreateDescriptor");
}

Desc::~Desc() {
  if (d_) cudnnBackendDestroyDescriptor(d_);
}

Desc& Desc::operator=(Desc&& o) noexcept {
  if (this != &o) {
    if (d_) cudnnBackendDestroyDescriptor(d_);
    d_ = o.d_;
    o.d_ = nullptr;
  }
  return *this;
}

Desc& Desc::set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count, const void* values) {
  const cudnnStatus_t st = cudnnBackendSetAttribute(d_, name, type, count, values);
  if (st != CUDNN_STATUS_SUCCESS)
    fail("cuDNN cudnnBackendSetAttribute(attribute {}, type {}, count {}) failed: {}", static_cast<int>(name),
         static_cast<int>(type), count, describe(st));
  return *this;
}

void Desc::finalize(const char* what) {
  const cudnnStatus_t st = cudnnBackendFinalize(d_);
  if (st != CUDNN_STATUS_SUCCESS) fail("cuDNN finalize of {} failed: {}", what, describe(st));
}

}  // namespace mt::cuda::cudnn

#endif  // MT_HAVE_CUDNN
