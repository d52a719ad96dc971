// --attention-backend (Megatron's flag): the choices megatron.cpp has, the ones it rejects by
// name, and the combinations validate_args refuses before any GPU work; --nondeterministic-attention.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "training/arguments.h"

namespace mt {
namespace {

// The error text of parsing + validating a small run with `flags` added ("" when accepted).
std::string error_of(std::vector<std::string> flags, Arguments* out = nullptr) {
  std::vector<std::string> argv{"--num-layers", "2",    "--hidden-size",      "32", "--num-attention-heads", "4",
                                "--seq-length", "16",   "--micro-batch-size", "2",  "--train-iters",         "2",
                                "--lr",         "1e-3", "--mock-data"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  try {
    Arguments a = parse_pretrain_args(argv);
    validate_args(a, 64);
    if (out) *out = a;
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(AttentionBackendFlag, DefaultIsAuto) {
  Arguments a;
  EXPECT_EQ(error_of({}, &a), "");
  EXPECT_EQ(a.attention_backend, "auto");
}

TEST(AttentionBackendFlag, AcceptsOurChoices) {
  Arguments a;
  EXPECT_EQ(error_of({"--attention-backend", "flash"}, &a), "");
  EXPECT_EQ(a.attention_backend, "flash");
  EXPECT_EQ(error_of({"--attention-backend", "auto"}, &a), "");
  EXPECT_EQ(a.attention_backend, "auto");
  EXPECT_EQ(error_of({"--attention-backend", "fused", "--attention-dropout", "0"}, &a), "");
  EXPECT_EQ(a.attention_backend, "fused");
}

TEST(AttentionBackendFlag, RejectsMegatronBackendsWeLack) {
  for (const char* b : {"unfused", "local"}) {
    const std::string e = error_of({"--attention-backend", b});
    EXPECT_NE(e.find(std::string("no '") + b + "' attention"), std::string::npos) << e;
    EXPECT_NE(e.find("auto"), std::string::npos) << e;
    EXPECT_NE(e.find("flash"), std::string::npos) << e;
    EXPECT_NE(e.find("fused"), std::string::npos) << e;
  }
  EXPECT_NE(error_of({"--attention-backend", "cudnn"}).find("expected auto, flash or fused"), std::string::npos);
}

TEST(AttentionBackendFlag, FusedNeedsNoDropoutAndAGpu) {
  EXPECT_NE(error_of({"--attention-backend", "fused"}).find("--attention-dropout 0"), std::string::npos);
  EXPECT_NE(
      error_of({"--attention-backend", "fused", "--attention-dropout", "0", "--device", "cpu"}).find("--device cpu"),
      std::string::npos);
}

TEST(AttentionBackendFlag, DeterministicByDefault) {
  Arguments a;
  EXPECT_EQ(error_of({"--deterministic-mode"}, &a), "");
  EXPECT_FALSE(a.nondeterministic_attention);
  EXPECT_EQ(error_of({"--nondeterministic-attention"}, &a), "");
  EXPECT_TRUE(a.nondeterministic_attention);
  EXPECT_NE(error_of({"--deterministic-mode", "--nondeterministic-attention"}).find("contradict"), std::string::npos);
}

}  // namespace
}  // namespace mt
