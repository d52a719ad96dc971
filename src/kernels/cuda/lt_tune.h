#pragma once
// Autotuning of cuBLASLt GEMMs, one code for the bf16/fp32 Gemm (gemm.cu) and the FP8 GEMMs
// (fp8_gemm.cpp: per-tensor scales; fp8_block_gemm.cpp: block scales).
//
// The heuristic's first choice is an estimate and need not be the fastest kernel, so the first
// call of each plan (up to kMaxTunedPlans per tuner) times the heuristic's top candidates on the
// call's real inputs (one stream synchronisation per shape, in the first training step) and keeps
// the fastest. Different kernels may sum in a different order, and the project promises
// bit-identical results run to run and with tuning off, so a candidate is only eligible when its
// output is bit-identical (a 64-bit digest of every output element) to the heuristic default's on
// those inputs; inputs that are mostly zero cannot tell summation orders apart, so tuning waits
// for a later call (and gives up after kMaxDeferrals). In-place beta != 0 calls (the fp32 wgrad
// accumulation, C == D) are tuned on a scratch copy of D, so D is accumulated exactly once, by the
// real call. With a separate C (the residual forward) the candidates read C, never write it, and
// write D, which the real call then overwrites: no copy needed.
//
// Plain C++ (the FP8 GEMMs are host .cpp files); the digest kernel lives in lt_tune.cu.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>

namespace mt::cuda::lt_tune {

// Heuristic results a plan may keep: enough to hold the kernels that are fastest at our shapes,
// few enough that timing them all on the first call stays well under a second per shape.
constexpr int kMaxCandidates = 32;
// How many plans a tuner times: the dense model's shapes are a few dozen; the MoE experts' row
// counts change with the routing, so their shapes keep coming and each would cost a tuning pass
// (a stream sync and ~tens of ms). Past the cap, new plans keep the heuristic's default.
constexpr int kMaxTunedPlans = 128;

struct Mode {
  bool on = true, verbose = false;
};
// The mode a setting of MT_GEMM_TUNE (or MT_FP8_GEMM_TUNE) names: unset (null) or anything else
// -> on; 0/off/false/no -> off; verbose -> on, with a line per tuned shape on stderr.
Mode mode_from(const char* setting);
// MT_GEMM_TUNE_CANDIDATES (1..32, default 8): how many of the heuristic's results a plan asks for
// and times; a benchmarking knob.
int candidates();

// A column-major matrix as cuBLASLt reads or writes it: rows x cols, leading dimension ld,
// elements of `bytes` bytes (1: FP8 codes; 2: bf16/f16; 4: f32).
struct Matrix {
  const void* p = nullptr;
  int bytes = 2;
  int64_t rows = 0, cols = 0, ld = 0;
  // Bytes from the first element to the last (the padding between columns included).
  size_t span() const { return static_cast<size_t>((cols - 1) * ld + rows) * static_cast<size_t>(bytes); }
};

// One plan's tuning, kept beside its candidates.
struct State {
  int chosen = -1;  // index into the candidates once tuned (or given up on); -1 before
  int deferrals = 0;
};

// The call a plan is tuned on.
struct Job {
  const char* what = "gemm";  // the verbose lines' prefix
  int64_t m = 0, n = 0, k = 0;
  float beta = 0.f;
  Matrix a, b, d;         // cuBLASLt's A and B (inputs) and D (the call's output)
  bool in_place = false;  // beta != 0 with C == D: the candidates accumulate into a copy of D
  int count = 0;          // candidates; 0 is the heuristic's choice, the untuned default
  // Runs candidate i with `out` as D (and as C when in_place), in stream order; false when
  // cuBLASLt refuses it (before launching anything).
  std::function<bool(int i, void* out)> run;
};

// The tuning of a set of plans (a Gemm's, the FP8 GEMMs'): its mode and bounds. Not thread-safe:
// the caller holds its plans' lock.
class Tuner {
 public:
  explicit Tuner(Mode m) : mode(m) {}
  // The candidate a call of a plan in state st runs without timing anything: 0 with tuning off,
  // the chosen one once tuned (or, past kMaxTunedPlans, the default for good); -1: tune it now.
  int settled(State& st);
  // Times the job's candidates (synchronising the stream once) and returns the index to run now;
  // sets st.chosen unless tuning is put off (or the stream is being captured into a graph: the
  // default then, untimed). Call when settled() says -1.
  int tune(State& st, const Job& job, cudaStream_t s);

  Mode mode;
  int tuned = 0;     // plans whose candidates were timed and a choice made
  int attempts = 0;  // tune() calls, deferred ones included: bounded by kMaxTunedPlans
};

}  // namespace mt::cuda::lt_tune
