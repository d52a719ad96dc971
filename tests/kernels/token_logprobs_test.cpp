// token_logprobs (the engine's logprobs for `megatron serve`): the CPU reference against values
// worked out by hand (a uniform row, two logits, a shift that must not matter, the padded tail
// left out, NaN for an id outside the vocabulary), and the GPU kernel against the CPU on bf16,
// fp16 and fp32 logits up to Llama 3's 128256-column vocabulary (TokenLogprobsGpu, label gpu).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/ops.h"
#include "kernels/ops.h"
#include "support/gpu.h"
#include "test_util.h"

namespace mt::ops {
namespace {

std::vector<float> run(const std::vector<float>& v, const Shape& s, const std::vector<int32_t>& ids, int64_t vocab) {
  const Tensor id = Tensor::from_vector(ids, {static_cast<int64_t>(ids.size())});
  return token_logprobs(Tensor::from_vector(v, s), id, vocab).to_vector();
}

TEST(TokenLogprobs, LogSoftmaxOfTheRealVocabularyAtTheId) {
  const std::vector<float> v = {
      0, 0, 0, 0, 50,          // uniform over 4 (the 50 is padding): log(1/4)
      1, 2, 0, 0, 0,           // log(e/(e+e^2+2)) at id 0
      101, 102, 100, 100, -3,  // the same row shifted by 100: the same answer
      1, 2, 0, 0, 0,           // an id past the vocabulary: NaN
  };
  const std::vector<float> got = run(v, {4, 5}, {3, 0, 0, 4}, 4);
  const double e = std::exp(1.0), want = std::log(e / (e + e * e + 2));
  EXPECT_NEAR(got[0], std::log(0.25), 1e-6);
  EXPECT_NEAR(got[1], want, 1e-6);
  EXPECT_NEAR(got[2], want, 1e-5);
  EXPECT_TRUE(std::isnan(got[3]));
  EXPECT_TRUE(std::isnan(run({0, 0}, {1, 2}, {-1}, 2)[0]));
}

TEST(TokenLogprobs, Bf16LogitsScoreAsTheirWidening) {
  const std::vector<float> v = test::rounded(test::random_vec<float>(3 * 70, 5, -6, 6));
  const std::vector<int32_t> ids = {0, 33, 63};
  const Tensor id = Tensor::from_vector(ids, {3});
  const std::vector<float> f = token_logprobs(Tensor::from_vector(v, {3, 70}), id, 64).to_vector();
  const std::vector<float> b = token_logprobs(Tensor::from_vector(v, {3, 70}).to(DType::BF16), id, 64).to_vector();
  EXPECT_EQ(f, b);
}

TEST(TokenLogprobs, RefusesBadShapes) {
  const Tensor l = Tensor::zeros({2, 4}, DType::F32);
  EXPECT_THROW(token_logprobs(l, Tensor::from_vector(std::vector<int32_t>{0, 1}, {2}), 5), Error);
  EXPECT_THROW(token_logprobs(l, Tensor::from_vector(std::vector<int32_t>{0}, {1}), 4), Error);
  EXPECT_THROW(token_logprobs(l, Tensor::from_vector(std::vector<float>{0, 1}, {2}), 4), Error);
}

// The GPU kernel against the CPU reference on the same (rounded) values: ids spread over the
// vocabulary, including its first and last columns and the row's largest logit.
void expect_gpu_matches_cpu(int64_t R, int64_t vocab, int64_t padded, DType dt) {
  SCOPED_TRACE(testing::Message() << R << " rows, vocabulary " << vocab << " of " << padded << ", "
                                  << dtype_name(dt));
  std::vector<float> v = test::rounded(test::random_vec<float>(static_cast<size_t>(R * padded), 91, -8, 8));
  for (int64_t r = 0; r < R; ++r)  // a large padded tail that must not count
    for (int64_t c = vocab; c < padded; ++c) v[static_cast<size_t>(r * padded + c)] = 40.f;
  std::vector<int32_t> ids(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) ids[static_cast<size_t>(r)] = static_cast<int32_t>((r * 7919) % vocab);
  ids[0] = 0;
  if (R > 1) ids[1] = static_cast<int32_t>(vocab - 1);
  if (R > 2) {
    ids[2] = 5;
    v[static_cast<size_t>(2 * padded + 5)] = 9.f;  // the row's largest: log p near 0
  }
  const Tensor cpu = Tensor::from_vector(v, {R, padded});
  const Tensor id = Tensor::from_vector(ids, {R});
  const std::vector<float> want = token_logprobs(cpu, id, vocab).to_vector();
  const std::vector<float> got =
      token_logprobs(cpu.to(dt).to_device(Device::CUDA), id.to_device(Device::CUDA), vocab).to_device(Device::CPU).to_vector();
  ASSERT_EQ(got.size(), want.size());
  for (size_t r = 0; r < got.size(); ++r)  // fp32 sums of up to 128k terms against double ones
    EXPECT_NEAR(got[r], want[r], 2e-5 * (1 + std::fabs(want[r]))) << "row " << r;
}

TEST(TokenLogprobsGpu, MatchesTheCpu) {
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  test::gpu();
  expect_gpu_matches_cpu(5, 280, 300, DType::BF16);
  expect_gpu_matches_cpu(3, 100, 128, DType::F32);
  expect_gpu_matches_cpu(4, 1000, 1024, DType::F16);
  expect_gpu_matches_cpu(64, 128256, 128256, DType::BF16);
  expect_gpu_matches_cpu(1, 1, 8, DType::BF16);  // a vocabulary of one: log 1 = 0
  // An id outside the vocabulary is NaN on the GPU too.
  const Tensor l = Tensor::zeros({1, 8}, DType::F32, Device::CUDA);
  const Tensor bad = Tensor::from_vector(std::vector<int32_t>{6}, {1}).to_device(Device::CUDA);
  EXPECT_TRUE(std::isnan(token_logprobs(l, bad, 4).to_device(Device::CPU).to_vector()[0]));
}

}  // namespace
}  // namespace mt::ops
