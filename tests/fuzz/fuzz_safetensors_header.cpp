// libFuzzer target: the safetensors header check (checkpoint shards and HF weights). Every tensor
// it accepts must lie inside the bytes given: the target reads each one (ASan reports a read
// past the input) and converts the float ones as read_f32 would.
#include <cstdint>
#include <cstring>
#include <vector>

#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "core/tensor.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto h = mt::checkpoint::parse_safetensors(data, size, "fuzz.safetensors");
    for (const auto& [name, e] : h.tensors) {
      std::vector<uint8_t> copy(e.nbytes);
      if (e.nbytes) std::memcpy(copy.data(), e.data, e.nbytes);
      const bool is_float = e.dtype == mt::DType::F32 || e.dtype == mt::DType::BF16 || e.dtype == mt::DType::F16;
      if (is_float && mt::shape_numel(e.shape) <= (1 << 16)) {
        mt::Tensor t = mt::Tensor::empty(e.shape, e.dtype);
        if (e.nbytes) std::memcpy(t.raw(), e.data, e.nbytes);
        (void)t.to_vector();
      }
    }
  } catch (const mt::Error&) {
  }
  return 0;
}
