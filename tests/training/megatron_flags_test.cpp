// The Megatron flag table (src/training/megatron_flags.def) against Megatron-LM 0.20's parser
// (its flags extracted once into tests/training/data/megatron_lm_0.20_flags.tsv) and against
// pretrain's parser: complete, each flag once, consistent; and docs/megatron-flags.md is what
// the table generates.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "core/error.h"
#include "training/arguments.h"
#include "training/megatron_flags.h"

namespace mt {
namespace {

std::string read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::string> megatron_lm_flags() {
  std::vector<std::string> names;
  std::istringstream in(read(std::string(MT_SOURCE_DIR) + "/tests/training/data/megatron_lm_0.20_flags.tsv"));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) names.push_back(line.substr(0, line.find('\t')));
  return names;
}

TEST(MegatronFlags, TableHoldsEveryMegatronFlagOnceAndNothingElse) {
  const auto lm = megatron_lm_flags();
  ASSERT_GT(lm.size(), 800u);
  std::set<std::string> table;
  for (const auto& f : megatron_flags()) EXPECT_TRUE(table.insert(f.name).second) << f.name << " listed twice";
  const std::set<std::string> expected(lm.begin(), lm.end());
  for (const auto& n : expected) EXPECT_TRUE(table.count(n)) << n << " (Megatron-LM) is missing from the table";
  for (const auto& n : table) EXPECT_TRUE(expected.count(n)) << n << " is in the table but not Megatron-LM's";
}

TEST(MegatronFlags, TableAgreesWithThePretrainParser) {
  const auto names = pretrain_flag_names();
  const std::set<std::string> registered(names.begin(), names.end());
  for (const auto& f : megatron_flags()) {
    switch (f.status) {
      case MegatronFlagStatus::IMPLEMENTED:
      case MegatronFlagStatus::NOOP:
        EXPECT_TRUE(registered.count(f.name)) << f.name << " is listed as accepted but pretrain does not register it";
        break;
      case MegatronFlagStatus::REJECTED:
        EXPECT_FALSE(registered.count(f.name)) << f.name << " is registered but the table rejects it: move it";
        EXPECT_NE(std::string(f.note), "") << f.name << ": a rejection says what it waits for";
        break;
    }
    if (f.status == MegatronFlagStatus::NOOP) {
      EXPECT_NE(std::string(f.note), "") << f.name << ": a no-op says why";
    }
  }
  EXPECT_TRUE(pretrain_rejected_registered().empty());
}

TEST(MegatronFlags, RejectedFlagNamesItsReasonAndUnknownFlagsGetASuggestion) {
  try {
    parse_pretrain_args({"--wandb-project", "x"});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--wandb-project is a Megatron-LM flag"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not implemented"), std::string::npos) << e.what();
  }
  try {
    parse_pretrain_args({"--num-layer", "2"});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean --num-layers?"), std::string::npos) << e.what();
  }
  // Accepted no-ops take their values as Megatron's parser does.
  const Arguments a = parse_pretrain_args({"--manual-gc", "--empty-unused-memory-level", "1", "--num-workers", "2"});
  EXPECT_TRUE(a.was_given("--manual-gc"));
}

TEST(MegatronFlags, CommittedDocumentIsGenerated) {
  const std::string doc = read(std::string(MT_SOURCE_DIR) + "/docs/megatron-flags.md");
  EXPECT_TRUE(doc == megatron_flags_markdown())
      << "docs/megatron-flags.md is stale: run build/bin/megatron flags --markdown > docs/megatron-flags.md";
}

}  // namespace
}  // namespace mt
