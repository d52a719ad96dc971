#pragma once
// Which vector kernel the FP8 casts and the codes' transpose run (fp8.cu, fp8_codes.cu): the 8x8
// lane blocks transposed in registers (the default), or the 64x64 shared-memory tiles they
// replaced (MT_FP8_CAST_KERNEL=tile). Both write the same bytes; the tiles stay as the A/B until
// the two are measured on a GPU (cuda_ops_bench --only=fp8cast times both), then one goes.
namespace mt::ops::gpu {

bool fp8_cast_smem_tiles();
// Overrides MT_FP8_CAST_KERNEL from now on (the bench and the tests run both).
void set_fp8_cast_smem_tiles(bool on);

}  // namespace mt::ops::gpu
