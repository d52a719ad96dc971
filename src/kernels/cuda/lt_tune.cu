// The timing and the bit-identity guard of lt_tune.h, for every cuBLASLt GEMM that tunes.
#include "kernels/cuda/lt_tune.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/common.cuh"

namespace mt::cuda::lt_tune {

namespace {

constexpr int kTuneRuns = 5;       // timed runs per candidate (rounds over all candidates); the median counts
constexpr int kMaxDeferrals = 3;   // calls with uninformative inputs before a plan keeps its default
constexpr double kMinGain = 0.01;  // a candidate must beat the default by this fraction

// ---- Digests for the guard. Each element of a column-major matrix contributes
// mix64(position, bits); the contributions are added mod 2^64, which does not depend on the
// order, so integer atomics keep the digest deterministic. Any changed bit changes the sum
// except with probability ~2^-64. The same pass counts the non-zero elements (+-0 are zero, in
// every float format here and in both FP8 formats: the magnitude bits decide).
struct Digest {
  unsigned long long hash, nonzero;
};

// splitmix64's finaliser: a bijection that spreads every input bit over the output.
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

template <typename W>
__global__ void digest_kernel(const W* __restrict__ p, int64_t rows, int64_t cols, int64_t ld, Digest* out) {
  constexpr W kMagnitude = static_cast<W>(static_cast<W>(~W{0}) >> 1);  // all bits but the sign
  uint64_t h = 0, nz = 0;
  for (int64_t j = blockIdx.y; j < cols; j += gridDim.y)
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const W w = p[j * ld + i];
      h += mix64((static_cast<uint64_t>(j * rows + i) * 0x9e3779b97f4a7c15ull) ^ w);
      nz += (w & kMagnitude) != 0;
    }
  for (int off = 16; off > 0; off >>= 1) {
    h += __shfl_down_sync(0xffffffffu, h, off);
    nz += __shfl_down_sync(0xffffffffu, nz, off);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(&out->hash, static_cast<unsigned long long>(h));
    atomicAdd(&out->nonzero, static_cast<unsigned long long>(nz));
  }
}

// Adds the digest of `m` into *out (zeroed by the caller), in stream order.
void digest(const Matrix& m, Digest* out, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(ceil_div(m.rows, 256), 32)),
                  static_cast<unsigned>(std::min<int64_t>(m.cols, 2048)));
  switch (m.bytes) {
    case 1: digest_kernel<<<grid, 256, 0, s>>>(static_cast<const uint8_t*>(m.p), m.rows, m.cols, m.ld, out); break;
    case 2: digest_kernel<<<grid, 256, 0, s>>>(static_cast<const uint16_t*>(m.p), m.rows, m.cols, m.ld, out); break;
    default: digest_kernel<<<grid, 256, 0, s>>>(static_cast<const uint32_t*>(m.p), m.rows, m.cols, m.ld, out);
  }
  MT_CUDA_LAUNCH_CHECK();
}

// Stream-ordered device memory that may fail: tuning is optional, so running out of memory for
// it means "not now" rather than an error. Aligned to 256 bytes, as the plan's D may be.
class TuneBuffer {
 public:
  TuneBuffer(size_t bytes, cudaStream_t s) : s_(s) {
    if (bytes && cudaMallocAsync(&raw_, bytes + 256, s) != cudaSuccess) {
      raw_ = nullptr;
      cudaGetLastError();  // clear it, or the next launch check would report it
    }
  }
  ~TuneBuffer() {
    if (raw_) cudaFreeAsync(raw_, s_);
  }
  TuneBuffer(const TuneBuffer&) = delete;
  TuneBuffer& operator=(const TuneBuffer&) = delete;
  template <typename T>
  T* as() const {
    if (!raw_) return nullptr;
    const uintptr_t a = (reinterpret_cast<uintptr_t>(raw_) + 255) & ~uintptr_t{255};
    return reinterpret_cast<T*>(a);
  }

 private:
  void* raw_ = nullptr;
  cudaStream_t s_;
};

// What timing one candidate found, read back after the stream synchronises.
struct Trial {
  bool ran = false;
  std::array<cudaEvent_t, 2 * kTuneRuns> ev{};
  float ms = 0;  // median of the timed runs
};

// Runs candidate i twice from the same starting D (and the same C), digesting each output into
// dg[0] and dg[1] (the guard compares both with the default's first). False when it cannot run.
// Stream order.
bool check_candidate(const Job& job, int i, void* out, Digest* dg, cudaStream_t s) {
  Matrix d = job.d;
  d.p = out;
  for (int rep = 0; rep < 2; ++rep) {
    if (out != job.d.p) MT_CUDA_CHECK(cudaMemcpyAsync(out, job.d.p, job.d.span(), cudaMemcpyDeviceToDevice, s));
    if (!job.run(i, out)) return false;
    digest(d, &dg[rep], s);
  }
  return true;
}

// kTuneRuns rounds, each timing every runnable candidate once, back to back: no copies or
// digests between the timed runs (they would leave L2 and clocks in a state the real calls do
// not see) and interleaved so that drift in clocks or temperature spreads over all candidates.
// In-place beta != 0 runs keep accumulating into the scratch copy: its values no longer matter.
void time_candidates(std::vector<Trial>& trials, const Job& job, void* out, cudaStream_t s) {
  for (Trial& t : trials)
    if (t.ran)
      for (cudaEvent_t& e : t.ev) MT_CUDA_CHECK(cudaEventCreate(&e));
  for (int r = 0; r < kTuneRuns; ++r)
    for (size_t i = 0; i < trials.size(); ++i) {
      if (!trials[i].ran) continue;
      MT_CUDA_CHECK(cudaEventRecord(trials[i].ev[2 * r], s));
      // It ran before, so a failure now is an error.
      MT_CHECK(job.run(static_cast<int>(i), out), "{} tune: candidate {} of a {}x{}x{} GEMM failed on a second run",
               job.what, i, job.m, job.n, job.k);
      MT_CUDA_CHECK(cudaEventRecord(trials[i].ev[2 * r + 1], s));
    }
}

// Reads a synchronised trial's events (and destroys them).
float median_ms(Trial& t) {
  if (!t.ran) return 0;
  std::array<float, kTuneRuns> ms{};
  for (int r = 0; r < kTuneRuns; ++r) {
    MT_CUDA_CHECK(cudaEventElapsedTime(&ms[r], t.ev[2 * r], t.ev[2 * r + 1]));
    cudaEventDestroy(t.ev[2 * r]);
    cudaEventDestroy(t.ev[2 * r + 1]);
  }
  std::sort(ms.begin(), ms.end());
  return ms[kTuneRuns / 2];
}

// Whether an input can tell summation orders apart: mostly zero inputs (zero-initialised
// weights, masked gradients) make every order agree, and the guard would pass candidates that
// differ on later data.
bool informative(const Digest& d, const Matrix& m) {
  return d.nonzero * 8 >= static_cast<unsigned long long>(m.rows * m.cols);
}

}  // namespace

Mode mode_from(const char* v) {
  if (!v) return {};
  for (const char* off : {"0", "off", "false", "no"})
    if (std::strcmp(v, off) == 0) return {false, false};
  return {true, std::strcmp(v, "verbose") == 0};
}

int candidates() {
  static const int n = [] {
    const char* v = std::getenv("MT_GEMM_TUNE_CANDIDATES");
    const int k = v ? std::atoi(v) : 8;
    return k < 1 ? 1 : k > kMaxCandidates ? kMaxCandidates : k;
  }();
  return n;
}

int Tuner::settled(State& st) {
  if (!mode.on) return 0;
  if (st.chosen < 0 && attempts >= kMaxTunedPlans) st.chosen = 0;
  return st.chosen;
}

namespace {

int defer(State& st, const Job& job, const Mode& mode, const char* why) {
  if (++st.deferrals >= kMaxDeferrals) st.chosen = 0;
  if (mode.verbose)
    std::fprintf(stderr, "%s tune m=%lld n=%lld k=%lld: put off (%s)%s\n", job.what, static_cast<long long>(job.m),
                 static_cast<long long>(job.n), static_cast<long long>(job.k), why,
                 st.chosen == 0 ? ", keeping the default" : "");
  return 0;
}

// The fastest candidate whose two checked outputs are bit-identical to the default's first one;
// the default unless one beats it by kMinGain. host: digests of A, B, then two per candidate.
int pick(const std::vector<Trial>& trials, const std::vector<Digest>& host, const Job& job, const Mode& mode) {
  const unsigned long long ref = host[2].hash;
  int best = 0, survivors = 0;
  // A default that is not itself reproducible leaves nothing to compare with: keep it.
  const bool ref_ok = trials[0].ran && host[3].hash == ref;
  for (int i = 0; ref_ok && i < static_cast<int>(trials.size()); ++i) {
    if (!trials[i].ran || host[2 + 2 * i].hash != ref || host[3 + 2 * i].hash != ref) continue;
    ++survivors;
    if (trials[i].ms < trials[best].ms) best = i;
  }
  if (trials[best].ms > (1.0 - kMinGain) * trials[0].ms) best = 0;
  if (mode.verbose) {
    int fastest = best;  // any candidate, bit-identical or not: what the guard costs
    for (int i = 0; i < static_cast<int>(trials.size()); ++i)
      if (trials[i].ran && trials[i].ms < trials[fastest].ms) fastest = i;
    std::fprintf(stderr,
                 "%s tune m=%lld n=%lld k=%lld beta=%g: default %.4f ms, chosen #%d %.4f ms (%.1f%% faster), "
                 "%d of %zu candidates bit-identical; fastest of all #%d %.4f ms\n",
                 job.what, static_cast<long long>(job.m), static_cast<long long>(job.n), static_cast<long long>(job.k),
                 static_cast<double>(job.beta), static_cast<double>(trials[0].ms), best,
                 static_cast<double>(trials[best].ms),
                 trials[best].ms > 0 ? 100.0 * (trials[0].ms / trials[best].ms - 1.0) : 0.0, survivors, trials.size(),
                 fastest, static_cast<double>(trials[fastest].ms));
  }
  return best;
}

}  // namespace

int Tuner::tune(State& st, const Job& job, cudaStream_t s) {
  // A stream being captured into a CUDA graph cannot synchronise or time: the default now, and
  // the plan stays untuned for an eager call (the decode graphs warm up eagerly first).
  // (A query refused, e.g. of the legacy stream while another captures globally, counts as one.)
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &capturing) != cudaSuccess) {
    cudaGetLastError();  // clear it, or the next launch check would report it
    return 0;
  }
  if (capturing != cudaStreamCaptureStatusNone) return 0;
  ++attempts;
  const int n = job.count;
  if (n <= 1) return st.chosen = 0;
  // Beta == 0 or a separate C: the candidates may write D, the real call overwrites it.
  // Accumulating in place, they accumulate into a copy of D (restored before each checked run).
  TuneBuffer copy(job.in_place ? job.d.span() : 0, s);
  TuneBuffer digests((2 + 2 * n) * sizeof(Digest), s);
  void* out = job.in_place ? copy.as<void>() : const_cast<void*>(job.d.p);
  Digest* dg = digests.as<Digest>();
  if (!out || !dg) return defer(st, job, mode, "no memory for tuning");
  MT_CUDA_CHECK(cudaMemsetAsync(dg, 0, (2 + 2 * n) * sizeof(Digest), s));
  digest(job.a, &dg[0], s);
  digest(job.b, &dg[1], s);
  std::vector<Trial> trials(n);
  for (int i = 0; i < n; ++i) trials[i].ran = check_candidate(job, i, out, &dg[2 + 2 * i], s);
  time_candidates(trials, job, out, s);
  std::vector<Digest> host(2 + 2 * n);
  MT_CUDA_CHECK(cudaMemcpyAsync(host.data(), dg, host.size() * sizeof(Digest), cudaMemcpyDeviceToHost, s));
  MT_CUDA_CHECK(cudaStreamSynchronize(s));
  for (Trial& t : trials) t.ms = median_ms(t);
  if (!informative(host[0], job.a) || !informative(host[1], job.b)) return defer(st, job, mode, "inputs mostly zero");
  ++tuned;
  return st.chosen = pick(trials, host, job, mode);
}

}  // namespace mt::cuda::lt_tune
