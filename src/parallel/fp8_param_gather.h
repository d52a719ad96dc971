#pragma once
// --fp8-param-gather (Megatron with Transformer Engine's FP8 parameters): the weights of the FP8
// linears (Param::fp8_gathered) sit in buckets of their own, and after each optimizer step every
// data-parallel rank casts its updated fp32 shard of them straight to FP8 and all-gathers the
// codes: 1 byte a parameter instead of the fp32 main values' 4 (a bf16 gather's 2). The scale is
// the whole weight's: each rank's shard amax, max-reduced over the bucket's group (DP x CP) and
// TP, so the gathered bytes are those of one rank casting the full fp32 weight. The linears then
// read these codes and their scale_inv in every FP8 GEMM (Fp8LinearState::param_gathered) and
// never cast the weight themselves.
// Consequences: the model's bf16 copy of these weights is not refreshed, nor the fp32 main
// values outside this rank's shard (nothing reads them: the optimizer, grad norm and parameter
// norm work on owned slices); gather_main_values brings the latter in before a checkpoint save.
#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "model/params.h"

namespace mt::parallel {

struct Bucket;

// One FP8 bucket's codes (gathered in place) and the amaxes of its weights.
struct Fp8Bucket {
  Tensor codes;   // U8 [end - begin], the bucket's flat range
  Tensor amaxes;  // f32 [weights]: this rank's shard amaxes, then the reduced ones
  std::vector<const model::Param*> weights;
};

// Casts the flat range [lo, hi) of FP8 bucket `k` (this rank's shard, or the whole bucket when
// it is not sharded) into f.codes at the same offsets, for every weight that overlaps it; the
// amaxes are max-reduced over `group` (null: the bucket is whole here) and each weight's TP
// group. `roll`: delayed scaling's pending amaxes join their histories first (after an
// optimizer step; not for the first cast after a start or a load, whose state is as saved).
// Points each linear's weight_codes at its bytes in f.codes (valid once the gather lands).
void cast_fp8_bucket(Fp8Bucket& f, const Bucket& k, model::ParamStore& ps, int64_t lo, int64_t hi,
                     comm::Communicator* group, bool roll);

}  // namespace mt::parallel
