// The dispatch: one switch on the device per op of ops.def, to the host (CPU) or gpu (CUDA)
// implementation of the same signature (op_backends.h).
#include "kernels/ops.h"

#include "core/error.h"
#include "kernels/op_backends.h"

namespace mt::ops {
namespace {

Device device_of(const Tensor& t) { return t.device(); }
Device device_of(Device d) { return d; }

}  // namespace

#define MT_DEFAULT(v)
#define MT_OP(result, name, on, params, args)              \
  result name params {                                     \
    switch (device_of(on)) {                               \
      case Device::CPU:                                    \
        return host::name args;                            \
      case Device::CUDA:                                   \
        return gpu::name args;                             \
    }                                                      \
    fail("ops::" #name ": a tensor on an unknown device"); \
  }
#include "kernels/ops.def"
#undef MT_OP
#undef MT_DEFAULT

}  // namespace mt::ops
