// --moe-layer-freq: Megatron's integer and Python-list forms, parsed without eval.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "support/error_of.h"
#include "training/moe_layer_freq.h"

namespace mt {
namespace {

std::vector<bool> bits(std::initializer_list<int> v) {
  std::vector<bool> out;
  for (int x : v) out.push_back(x == 1);
  return out;
}

std::string parse_error(const std::string& text) {
  return test::error_of([&] { parse_moe_layer_freq(text); });
}

TEST(MoELayerFreq, IntegerEveryNthLayerFromLayerZero) {
  const MoELayerFreq f = parse_moe_layer_freq("2");
  EXPECT_EQ(f.every, 2);
  EXPECT_EQ(moe_layer_pattern(f, 5), bits({1, 0, 1, 0, 1}));
  // 1: every layer, kept as the empty pattern.
  EXPECT_TRUE(moe_layer_pattern(parse_moe_layer_freq(" 1 "), 4).empty());
}

TEST(MoELayerFreq, PythonListExpressions) {
  EXPECT_EQ(parse_moe_layer_freq("([1]*3+[0]*1)*3").pattern, bits({1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0}));
  EXPECT_EQ(parse_moe_layer_freq("[1,0,1,0]").pattern, bits({1, 0, 1, 0}));
  EXPECT_EQ(parse_moe_layer_freq("([0]+[1]*3)").pattern, bits({0, 1, 1, 1}));
  EXPECT_EQ(parse_moe_layer_freq("2 * [1, 0,]").pattern, bits({1, 0, 1, 0}));  // int * list, trailing comma
  EXPECT_EQ(parse_moe_layer_freq("[1]*(1+1)*2").pattern, bits({1, 1, 1, 1}));
  EXPECT_EQ(parse_moe_layer_freq("[(0), 1*1]").pattern, bits({0, 1}));
  EXPECT_EQ(moe_layer_pattern(parse_moe_layer_freq("[1,0]"), 2), bits({1, 0}));
}

TEST(MoELayerFreq, MistakesNameTheFlagAndPosition) {
  EXPECT_EQ(parse_error("[1]+2"),
            "--moe-layer-freq: cannot add a list and an integer at position 4 in '[1]+2' (expected an integer N, or a "
            "list expression of 0s and 1s such as '([1]*3+[0]*1)*3')");
  EXPECT_NE(parse_error("[1,0").find("expected ',' or ']' at position 5"), std::string::npos);
  EXPECT_NE(parse_error("([1]*3").find("expected ')' at position 7"), std::string::npos);
  EXPECT_NE(parse_error("[1]*[0]").find("cannot multiply two lists at position 4"), std::string::npos);
  EXPECT_NE(parse_error("[[1]]").find("list entries must be integers, not lists at position 2"), std::string::npos);
  EXPECT_NE(parse_error("__import__('os')").find("unexpected '_' at position 1"), std::string::npos);
  EXPECT_NE(parse_error("[1]*-1").find("unexpected '-' at position 5"), std::string::npos);
  EXPECT_NE(parse_error("1 2").find("unexpected '2' at position 3"), std::string::npos);
  EXPECT_NE(parse_error("").find("the expression ends early at position 1"), std::string::npos);
  EXPECT_EQ(parse_error("0"), "--moe-layer-freq: the frequency must be at least 1 (got '0')");
  EXPECT_NE(parse_error("[1]*0").find("is empty"), std::string::npos);
  EXPECT_EQ(parse_error("[1,2]"),
            "--moe-layer-freq: entry 1 of the pattern '[1,2]' is 2; entries must be 0 (dense) or 1 (MoE)");
  try {
    moe_layer_pattern(parse_moe_layer_freq("[1,0,1]"), 4);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "--moe-layer-freq: the pattern has 3 entries but the model has 4 layers (--num-layers); give one per "
                 "layer");
  }
}

TEST(MoELayerFreq, HostileSizesAreBounded) {
  EXPECT_NE(parse_error("[1]*100000").find("more than 65536 entries"), std::string::npos);
  EXPECT_NE(parse_error("[1]*65536*2").find("more than 65536 entries"), std::string::npos);
  EXPECT_NE(parse_error("([1]*65536)+[0]").find("more than 65536 entries"), std::string::npos);
  EXPECT_NE(parse_error("99999999999999999999999").find("the number is too large"), std::string::npos);
  EXPECT_NE(parse_error("65536*65536*65536").find("the number is too large"), std::string::npos);
  EXPECT_NE(parse_error(std::string(100000, '(')).find("nests too deeply"), std::string::npos);
  EXPECT_NE(parse_error(std::string(100000, '[')).find("nests too deeply"), std::string::npos);
  EXPECT_EQ(parse_moe_layer_freq("[1]*65536").pattern.size(), 65536u);
  // An empty list repeated 2^32 times is refused at once (fuzz finding: it looped 2^32 times).
  EXPECT_NE(parse_error("4294967296*[]*4294967296+[]").find("is empty"), std::string::npos);
}

}  // namespace
}  // namespace mt
