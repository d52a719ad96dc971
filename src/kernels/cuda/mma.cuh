#pragma once
// Tensor-core building blocks for the attention kernels (sm_80+ PTX, used on Hopper too):
// cp.async tile loads into XOR-swizzled shared memory, ldmatrix fragment loads, and the
// m16n8k16 bf16 MMA with fp32 accumulators.
//
// Fragment layouts of mma.m16n8k16 (g = lane / 4, t = lane % 4):
//   A (16x16, row-major): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
//   B (16x8, "col"):      b0 = (k 2t..2t+1, n g), b1 = (k 2t+8.., n g)
//   C (16x8, fp32):       c0,c1 = (g, 2t..2t+1), c2,c3 = (g+8, 2t..2t+1)
// So the accumulators of two neighbouring 8-column C tiles, rounded to bf16 pairs, are exactly an
// A fragment over those 16 columns: scores become the next product's A operand in registers.
#include <cuda_bf16.h>

#include <cstdint>

namespace mt::cuda::mma {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy; zero-fills the destination when !valid (nothing is read).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

__device__ __forceinline__ void mma_bf16(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> a bf16 pair, the first in the low half (the lower column of a fragment).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// A [rows][D] bf16 tile in shared memory whose 16-byte chunks are XOR-swizzled by row % 8, so
// that the 8 row addresses of an ldmatrix (same logical chunk, 8 consecutive rows) and the
// cp.async stores fall in 8 different bank groups. Needs D >= 64.
template <int D>
struct SwizzledTile {
  static_assert(D % 64 == 0, "swizzle needs at least 8 chunks per row");
  static constexpr int kChunks = D / 8;
  __device__ __forceinline__ static int offset(int r, int c8) { return r * D + ((c8 ^ (r & 7)) << 3); }

  // Loads `rows` rows (row stride D in global memory) with cp.async; rows >= valid become zeros.
  template <int kThreads>
  __device__ __forceinline__ static void load(__nv_bfloat16* sm, const __nv_bfloat16* g, int rows, int valid) {
    for (int idx = threadIdx.x; idx < rows * kChunks; idx += kThreads) {
      const int r = idx / kChunks, c = idx % kChunks;
      const bool ok = r < valid;
      cp_async16(smem_addr(sm + offset(r, c)), g + static_cast<int64_t>(ok ? r : 0) * D + c * 8, ok);
    }
  }
};

}  // namespace mt::cuda::mma
