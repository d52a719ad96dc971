// --attention-backend (Megatron's flag): the choices megatron.cpp has, the ones it rejects by
// name, and the combinations validate_args refuses before any GPU work; --nondeterministic-attention.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "support/tiny_training.h"
#include "training/arguments.h"

namespace mt {
namespace {

using test::pretrain_args_error;

TEST(AttentionBackendFlag, DefaultIsAuto) {
  Arguments a;
  EXPECT_EQ(pretrain_args_error({}, &a), "");
  EXPECT_EQ(a.attention_backend, "auto");
}

TEST(AttentionBackendFlag, AcceptsOurChoices) {
  Arguments a;
  EXPECT_EQ(pretrain_args_error({"--attention-backend", "flash"}, &a), "");
  EXPECT_EQ(a.attention_backend, "flash");
  EXPECT_EQ(pretrain_args_error({"--attention-backend", "auto"}, &a), "");
  EXPECT_EQ(a.attention_backend, "auto");
  EXPECT_EQ(pretrain_args_error({"--attention-backend", "fused", "--attention-dropout", "0"}, &a), "");
  EXPECT_EQ(a.attention_backend, "fused");
}

TEST(AttentionBackendFlag, RejectsMegatronBackendsWeLack) {
  for (const char* b : {"unfused", "local"}) {
    const std::string e = pretrain_args_error({"--attention-backend", b});
    EXPECT_NE(e.find(std::string("no '") + b + "' attention"), std::string::npos) << e;
    EXPECT_NE(e.find("auto"), std::string::npos) << e;
    EXPECT_NE(e.find("flash"), std::string::npos) << e;
    EXPECT_NE(e.find("fused"), std::string::npos) << e;
  }
  EXPECT_NE(pretrain_args_error({"--attention-backend", "cudnn"}).find("expected auto, flash or fused"),
            std::string::npos);
}

TEST(AttentionBackendFlag, FusedNeedsNoDropoutAndAGpu) {
  EXPECT_NE(pretrain_args_error({"--attention-backend", "fused"}).find("--attention-dropout 0"), std::string::npos);
  EXPECT_NE(pretrain_args_error({"--attention-backend", "fused", "--attention-dropout", "0", "--device", "cpu"})
                .find("--device cpu"),
            std::string::npos);
}

TEST(AttentionBackendFlag, DeterministicByDefault) {
  Arguments a;
  EXPECT_EQ(pretrain_args_error({"--deterministic-mode"}, &a), "");
  EXPECT_FALSE(a.nondeterministic_attention);
  EXPECT_EQ(pretrain_args_error({"--nondeterministic-attention"}, &a), "");
  EXPECT_TRUE(a.nondeterministic_attention);
  EXPECT_NE(pretrain_args_error({"--deterministic-mode", "--nondeterministic-attention"}).find("contradict"),
            std::string::npos);
}

}  // namespace
}  // namespace mt
