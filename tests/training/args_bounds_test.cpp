// Pretrain flags: every count is bounded and every product checked before anything is allocated;
// float flags must be finite and in their range; 0 is not a way to ask for a default.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/tiny_training.h"
#include "training/arguments.h"

namespace mt {
namespace {

using test::pretrain_args_error;

void expect_error(const std::vector<std::string>& flags, const std::string& needle) {
  const std::string e = pretrain_args_error(flags);
  EXPECT_NE(e.find(needle), std::string::npos) << "wanted: " << needle << "\ngot: " << e;
}

const std::vector<std::string> kLlama = {"--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
                                         "--disable-bias-linear"};

std::vector<std::string> llama(std::vector<std::string> flags) {
  flags.insert(flags.end(), kLlama.begin(), kLlama.end());
  return flags;
}

TEST(ArgsBounds, HugeModelSizesAreRefusedByName) {
  expect_error(llama({"--hidden-size", "4611686018427387904"}),
               "--hidden-size: value out of range (got 4611686018427387904; expected 1 to 1048576)");
  expect_error(llama({"--seq-length", "4611686018427387904"}), "--seq-length: value out of range");
  expect_error({"--num-layers", "1000000000"}, "--num-layers: value out of range (got 1000000000; expected 1 to 65536)");
  expect_error({"--num-layers", "99999999999999999999"}, "--num-layers: value out of range");
  expect_error({"--ffn-hidden-size", "-1"}, "--ffn-hidden-size: value out of range");
  expect_error({"--num-attention-heads", "99999999"}, "--num-attention-heads: value out of range");
  expect_error({"--kv-channels", "99999999"}, "--kv-channels: value out of range");
  expect_error({"--max-position-embeddings", "99999999999"}, "--max-position-embeddings: value out of range");
}

TEST(ArgsBounds, ZeroIsNotTheDefault) {
  expect_error({"--ffn-hidden-size", "0"}, "--ffn-hidden-size: value out of range (got 0; expected 1 to");
  expect_error({"--kv-channels", "0"}, "--kv-channels: value out of range (got 0;");
  expect_error({"--group-query-attention", "--num-query-groups", "0"}, "--num-query-groups: value out of range (got 0;");
  expect_error({"--global-batch-size", "0"}, "--global-batch-size: value out of range (got 0;");
  expect_error({"--max-position-embeddings", "0"}, "--max-position-embeddings: value out of range (got 0;");
  Arguments a;  // absent, each is derived
  ASSERT_EQ(pretrain_args_error({}, &a), "");
  EXPECT_EQ(a.model.ffn_hidden_size, 4 * 32);
  EXPECT_EQ(a.model.kv_channels, 8);
  EXPECT_EQ(a.global_batch_size, 2);
}

TEST(ArgsBounds, CountsThatBecomeIntsAreBounded) {
  expect_error({"--num-threads", "99999999999"}, "--num-threads: value out of range (got 99999999999; expected 0 to 4096)");
  expect_error({"--tensor-model-parallel-size", "4294967296"}, "--tensor-model-parallel-size: value out of range");
  expect_error({"--pipeline-model-parallel-size", "4294967297"}, "--pipeline-model-parallel-size: value out of range");
  expect_error({"--distributed-timeout-minutes", "999999999999999"}, "--distributed-timeout-minutes: value out of range");
  expect_error({"--make-vocab-size-divisible-by", "4611686018427387904"},
               "--make-vocab-size-divisible-by: value out of range");
  expect_error({"--micro-batch-size", "9999999999999"}, "--micro-batch-size: value out of range");
}

TEST(ArgsBounds, ProductsAreChecked) {
  expect_error({"--train-iters", "281474976710656", "--global-batch-size", "65536"},
               "--train-iters x --global-batch-size (training samples)");
  expect_error({"--eval-iters", "281474976710656", "--eval-interval", "1", "--global-batch-size", "65536"},
               "--eval-iters x evaluations");
  expect_error({"--seq-length", "16777216", "--micro-batch-size", "1024", "--max-position-embeddings", "16777216"},
               "--micro-batch-size 1024 x --seq-length 16777216 = 17179869184 tokens per micro-batch");
  expect_error({"--num-layers", "65536", "--hidden-size", "1048576", "--num-attention-heads", "16384", "--kv-channels",
                "32768"},
               "parameter count of --num-layers 65536, --hidden-size 1048576");
  expect_error({"--num-attention-heads", "65536", "--kv-channels", "65536", "--hidden-size", "65536"},
               "the attention projections would be");
}

TEST(ArgsBounds, FloatsMustBeFiniteAndInRange) {
  expect_error({"--lr", "inf"}, "--lr must be a finite number, got 'inf'");
  expect_error({"--lr", "1e999"}, "--lr: value out of range");
  expect_error({"--clip-grad", "nan"}, "--clip-grad must be a finite number, got 'nan'");
  for (const char* f : {"--min-lr", "--weight-decay", "--adam-beta1", "--adam-beta2", "--adam-eps", "--init-method-std",
                        "--attention-dropout", "--hidden-dropout", "--norm-epsilon", "--rotary-base",
                        "--lr-warmup-fraction", "--lr-warmup-init", "--sgd-momentum"})
    expect_error({f, "nan"}, std::string(f) + " must be a finite number");
  expect_error({"--clip-grad", "-1"}, "--clip-grad must be >= 0 (got -1)");
  expect_error({"--min-lr", "-1"}, "--min-lr must be >= 0");
  expect_error({"--weight-decay", "-0.1"}, "--weight-decay must be >= 0");
  expect_error({"--adam-beta1", "1"}, "--adam-beta1 must be in [0, 1) (got 1)");
  expect_error({"--adam-beta2", "-0.5"}, "--adam-beta2 must be in [0, 1)");
  expect_error({"--adam-eps", "0"}, "--adam-eps must be positive");
  expect_error({"--sgd-momentum", "1"}, "--sgd-momentum must be in [0, 1)");
  expect_error({"--lr-warmup-fraction", "1.5"}, "--lr-warmup-fraction must be in [0, 1]");
  expect_error({"--attention-dropout", "1"}, "--attention-dropout must be in [0, 1)");
  expect_error({"--init-method-std", "0"}, "--init-method-std must be a positive finite number");
  expect_error({"--weight-decay-incr-style", "linear", "--start-weight-decay", "-2", "--end-weight-decay", "0.1"},
               "--start-weight-decay must be >= 0");
}

}  // namespace
}  // namespace mt
