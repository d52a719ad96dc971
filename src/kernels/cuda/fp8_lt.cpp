// The FP8 GEMMs' shared cuBLASLt state (fp8_lt.h): the handle, the heuristic's candidates per
// plan, and each call's run, tuned on a plan's first call (lt_tune.h).
#include "kernels/cuda/fp8_lt.h"

#include <array>
#include <cstdlib>

#include "kernels/cuda/ops_cuda.h"

namespace mt::ops::gpu {

Fp8Lt& fp8_lt() {
  static Fp8Lt s;
  static std::once_flag once;
  std::call_once(once, [] {
    check_lt(cublasLtCreate(&s.handle), "cublasLtCreate");
    MT_CUDA_CHECK(cudaMalloc(&s.workspace, s.workspace_bytes));
    const char* own = std::getenv("MT_FP8_GEMM_TUNE");
    s.tuner.mode = cuda::lt_tune::mode_from(own ? own : std::getenv("MT_GEMM_TUNE"));
  });
  return s;
}

void* Fp8Lt::workspace_for(cudaStream_t s) {
  auto it = stream_workspaces.find(s);
  if (it != stream_workspaces.end()) return it->second;
  void* w = workspace;
  if (!stream_workspaces.empty()) MT_CUDA_CHECK(cudaMalloc(&w, workspace_bytes));
  return stream_workspaces.emplace(s, w).first->second;
}

bool fp8_lt_candidates(Fp8Plan& p, const uint32_t align[4]) {
  Fp8Lt& h = fp8_lt();
  LtDescs& x = p.x;
  check_lt(cublasLtMatmulPreferenceCreate(&x.pref), "preference");
  check_lt(cublasLtMatmulPreferenceSetAttribute(x.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &h.workspace_bytes,
                                                sizeof h.workspace_bytes),
           "workspace preference");
  const cublasLtMatmulPreferenceAttributes_t which[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i)
    check_lt(cublasLtMatmulPreferenceSetAttribute(x.pref, which[i], &align[i], sizeof align[i]), "alignment preference");
  std::array<cublasLtMatmulHeuristicResult_t, cuda::lt_tune::kMaxCandidates> res{};
  int found = 0;
  // A refusal of the whole problem (an unsupported scale mode, type or shape) comes back as a
  // status or as no result; either way there is no algorithm.
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(h.handle, x.op, x.a, x.b, x.d, x.d, x.pref,
                                                           cuda::lt_tune::candidates(), res.data(), &found);
  for (int i = 0; st == CUBLAS_STATUS_SUCCESS && i < found; ++i)
    if (res[i].state == CUBLAS_STATUS_SUCCESS && res[i].workspaceSize <= h.workspace_bytes)
      p.cands.push_back(res[i].algo);
  if (p.cands.empty()) return false;
  ++h.plans;
  return true;
}

void fp8_lt_matmul(Fp8Plan& p, const Fp8LtCall& call, const char* what, cudaStream_t s) {
  Fp8Lt& h = fp8_lt();
  void* ws = h.workspace_for(s);
  // C == D accumulates in place (the weight gradient into the fp32 main grad); with beta 0 C is
  // not read, and cuBLASLt is given D for it.
  const void* c = call.c ? call.c : call.d;
  auto run = [&](int i, void* out) {
    const float alpha = 1.f;
    const void* cin = c == call.d ? out : c;
    return cublasLtMatmul(h.handle, p.x.op, &alpha, call.b, p.x.a, call.a, p.x.b, &call.beta, cin, p.x.d, out, p.x.d,
                          &p.cands[static_cast<size_t>(i)], ws, h.workspace_bytes, s);
  };
  int use = h.tuner.settled(p.tune);
  if (use < 0) {
    cuda::lt_tune::Job j;
    j.what = what;
    j.m = call.N, j.n = call.M, j.k = call.K, j.beta = call.beta;
    j.a = {call.b, 1, call.K, call.N, call.K};
    j.b = {call.a, 1, call.K, call.M, call.K};
    j.d = {call.d, call.d_bytes, call.N, call.M, call.N};
    j.in_place = call.beta != 0.f && c == call.d;
    j.count = static_cast<int>(p.cands.size());
    j.run = [&](int i, void* out) { return run(i, out) == CUBLAS_STATUS_SUCCESS; };
    use = h.tuner.tune(p.tune, j, s);
  }
  if (use != 0) ++h.runs_off_default;
  check_lt(run(use, call.d), "cublasLtMatmul");
}

void set_fp8_gemm_tuning(bool on) {
  Fp8Lt& h = fp8_lt();
  std::lock_guard<std::mutex> lock(h.mu);
  h.tuner.mode.on = on;
}

Fp8TuneStats fp8_gemm_tune_stats() {
  Fp8Lt& h = fp8_lt();
  std::lock_guard<std::mutex> lock(h.mu);
  return {h.plans, h.tuner.tuned, h.runs_off_default};
}

}  // namespace mt::ops::gpu
