// TransformerConfig::finalize checks sizes from any source (flags, a checkpoint's state.json, an
// HF config.json) before a default is derived from them or anything is allocated.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "core/error.h"
#include "model/config.h"

namespace mt::model {
namespace {

std::string finalize_error(const std::function<void(TransformerConfig&)>& edit) {
  TransformerConfig c;
  c.vocab_size = 128;
  edit(c);
  try {
    c.finalize();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ConfigLimits, DefaultsStillWork) {
  EXPECT_EQ(finalize_error([](TransformerConfig&) {}), "");
  TransformerConfig c;
  c.vocab_size = 128;
  c.finalize();
  EXPECT_GT(c.num_parameters(), 0);
}

TEST(ConfigLimits, SizesOutOfRangeNameTheFlag) {
  EXPECT_EQ(finalize_error([](TransformerConfig& c) { c.num_layers = 1000000000; }),
            "--num-layers: value out of range (got 1000000000; expected 1 to 65536)");
  EXPECT_EQ(finalize_error([](TransformerConfig& c) { c.ffn_hidden_size = -1; }),
            "--ffn-hidden-size: value out of range (got -1; expected 1 to 4194304)");
  EXPECT_EQ(finalize_error([](TransformerConfig& c) { c.hidden_size = int64_t{1} << 62; }),
            "--hidden-size: value out of range (got 4611686018427387904; expected 1 to 1048576)");
  EXPECT_EQ(finalize_error([](TransformerConfig& c) { c.num_query_groups = 8; }),
            "--num-query-groups: value out of range (got 8; expected 1 to 4)");
  EXPECT_NE(finalize_error([](TransformerConfig& c) { c.vocab_size = int64_t{1} << 40; }).find("vocabulary size"),
            std::string::npos);
}

TEST(ConfigLimits, NonFiniteFloatsAreRefused) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NE(finalize_error([&](TransformerConfig& c) { c.attention_dropout = nan; }).find("--attention-dropout"),
            std::string::npos);
  EXPECT_NE(finalize_error([&](TransformerConfig& c) { c.hidden_dropout = nan; }).find("--hidden-dropout"),
            std::string::npos);
  EXPECT_NE(finalize_error([&](TransformerConfig& c) { c.init_method_std = nan; }).find("--init-method-std"),
            std::string::npos);
  EXPECT_NE(finalize_error([&](TransformerConfig& c) { c.norm_epsilon = INFINITY; }).find("--norm-epsilon"),
            std::string::npos);
  EXPECT_NE(finalize_error([&](TransformerConfig& c) { c.rotary_percent = nan; }).find("--rotary-percent"),
            std::string::npos);
}

TEST(ConfigLimits, ParameterCountOverflowIsAnError) {
  const std::string e = finalize_error([](TransformerConfig& c) {
    c.num_layers = 65536;
    c.hidden_size = 1 << 20;
    c.num_attention_heads = 1 << 14;
    c.kv_channels = 1 << 15;
  });
  EXPECT_NE(e.find("parameter count of --num-layers 65536"), std::string::npos) << e;
  EXPECT_NE(e.find("is too large"), std::string::npos) << e;
}

TEST(ConfigLimits, PaddedVocabularyIsChecked) {
  EXPECT_EQ(padded_vocab_size(65, 128, 1), 128);
  EXPECT_EQ(padded_vocab_size(128, 128, 2), 256);
  EXPECT_THROW(padded_vocab_size(65, int64_t{1} << 62, 4), Error);
  EXPECT_THROW(padded_vocab_size(65, 0, 1), Error);
}

}  // namespace
}  // namespace mt::model
