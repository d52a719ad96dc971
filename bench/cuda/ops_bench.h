#pragma once
// What cuda_ops_bench's groups share (bench/cuda_ops_bench.cu defines them): timing, the JSON
// line per measurement, device-side random fills. A group in a file of its own (fp8_ops_bench.cpp)
// declares its entry point here.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <string>

namespace mt::bench {

// --quick: fewer iterations.
bool quick();
// Median over `reps` batches of `iters` calls of f(i), in ms per call, timed with events on s
// (after two warm-up calls).
double time_ms(const std::function<void(int)>& f, int iters, int reps = 5, cudaStream_t s = nullptr);
// One JSON line {"op", "shape", "ms", unit: rate, ...extra} (extra: more ",\"key\":value" pairs)
// and a row of the closing table.
void report(const std::string& op, const std::string& shape, double ms, double rate, const char* unit,
            const std::string& extra = "");
// n bf16 values uniform in [lo, hi) at p, from a per-element hash, in stream order on s.
void fill_uniform_bf16(void* p, int64_t n, uint64_t seed, float lo, float hi, cudaStream_t s);

// --only=fp8cast: the FP8 tensorwise casts (amax, cast + transpose, transposes of codes, the fused
// SwiGLU casts) at llama-1.5b's shapes, in GB/s and as a fraction of the measured copy rate.
void bench_fp8_casts();
// --only=fp8gemm: the FP8 GEMMs of a llama-1.5b layer with cuBLASLt autotuning off and on.
void bench_fp8_gemms();
// --only=gemvchain: decode's GEMVs back to back in one CUDA graph, as a decode step runs them
// (gemv_chain_bench.cpp), in GB/s and as a fraction of the copy rate.
void bench_gemv_chain();

}  // namespace mt::bench
