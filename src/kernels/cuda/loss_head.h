#pragma once
// Keeping a micro-batch's loss on the GPU: inputs go up without waiting for the device, the
// masked loss sum stays in a device accumulator until the trainer asks for it, and the loss
// gradient is formed from the device copy of the mask. Nothing here synchronises the host.
#include "core/tensor.h"

namespace mt::ops::gpu {

// A GPU copy of `shape` x `dtype` host values at `host`. The bytes are staged in pinned memory
// and copied on the compute stream, so the host does not wait for queued work (Tensor::to_device
// does); `host` may be reused as soon as this returns.
Tensor upload_async(const void* host, const Shape& shape, DType dtype);

// acc += sum_i losses[i] * mask[i], in fp64 by one block in a fixed order (deterministic).
// losses and mask f32 [n]; acc is an 8-byte tensor (I64 [1], Tensor has no f64) holding a double.
void accumulate_masked_loss(const Tensor& losses, const Tensor& mask, Tensor& acc);

// dloss = mask * scale, f32 [n] (the same fp32 product as the CPU path).
Tensor scaled_mask(const Tensor& mask, float scale);

}  // namespace mt::ops::gpu
