// argmax_rows on the CPU (the engine's greedy step; the GPU kernel is checked against this in
// backend_ops_test.cpp): the largest value of the real vocabulary, the lowest index on ties, NaN
// never chosen, and the padded columns past `vocab` never read.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/ops.h"

namespace mt::ops {
namespace {

std::vector<int32_t> ints(const Tensor& t) { return {t.data<int32_t>(), t.data<int32_t>() + t.numel()}; }

TEST(ArgmaxRows, LargestOfTheVocabularyLowestIndexOnTiesNeverNaN) {
  const float nan = std::nanf("");
  const std::vector<float> v = {
      1, 3, 2, 9,       // 9 sits in the padding: the answer is 1
      5, 5, 1, 0,       // a tie: the lower index
      nan, -2, -1, 0,   // NaN never wins, even first
      nan, nan, nan, 7, // nothing but NaN in the vocabulary: 0
  };
  const Tensor out = argmax_rows(Tensor::from_vector(v, {4, 4}), 3);
  ASSERT_EQ(out.dtype(), DType::I32);
  EXPECT_EQ(ints(out), (std::vector<int32_t>{1, 0, 2, 0}));
  // bf16 logits give the same ids as their fp32 widening.
  EXPECT_EQ(ints(argmax_rows(Tensor::from_vector(v, {4, 4}).to(DType::BF16), 3)),
            (std::vector<int32_t>{1, 0, 2, 0}));
}

TEST(ArgmaxRows, RefusesAVocabularyWiderThanTheRows) {
  EXPECT_THROW(argmax_rows(Tensor::zeros({2, 4}, DType::F32), 5), Error);
  EXPECT_THROW(argmax_rows(Tensor::zeros({2, 4}, DType::F32), 0), Error);
}

}  // namespace
}  // namespace mt::ops
