// FlagParser: numbers never wrap, narrow or turn into inf/nan silently; --config YAML of any
// shape is either applied or refused with one mt::Error naming the file.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "training/flag_parser.h"

namespace mt {
namespace {

struct Flags {
  int64_t n = 5, any = 0;
  uint64_t seed = 0;
  double d = 0.5;
  float f = 0.5f;
  bool on = false;
  std::vector<std::string> paths;
  FlagParser p{"test"};
  Flags() {
    p.value("--n", &n, "bounded count", {1, 10});
    p.value("--any", &any, "unbounded count");
    p.value("--seed", &seed, "seed");
    p.value("--d", &d, "double");
    p.value("--f", &f, "float");
    p.store_true("--on", &on, "switch");
    p.list("--paths", &paths, "list");
    p.enable_config();
  }
};

std::string error_of(const std::vector<std::string>& argv, Flags* out = nullptr) {
  Flags local;
  Flags& f = out ? *out : local;
  try {
    f.p.parse(argv);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(FlagParser, IntegersWithinTheirRange) {
  Flags f;
  EXPECT_EQ(error_of({"--n", "10", "--any", "-9223372036854775808"}, &f), "");
  EXPECT_EQ(f.n, 10);
  EXPECT_EQ(f.any, INT64_MIN);
  EXPECT_EQ(error_of({"--n", "11"}), "--n: value out of range (got 11; expected 1 to 10)");
  EXPECT_EQ(error_of({"--n", "0"}), "--n: value out of range (got 0; expected 1 to 10)");
  EXPECT_EQ(error_of({"--n", "99999999999999999999"}), "--n: value out of range (got 99999999999999999999; expected 1 to 10)");
  EXPECT_EQ(error_of({"--any", "9223372036854775808"}),
            "--any: value out of range (got 9223372036854775808; expected a 64-bit integer)");
  EXPECT_EQ(error_of({"--n", "1e3"}), "--n expects an integer, got '1e3'");
}

TEST(FlagParser, UnsignedNeverWraps) {
  Flags f;
  EXPECT_EQ(error_of({"--seed", "18446744073709551615"}, &f), "");
  EXPECT_EQ(f.seed, UINT64_MAX);
  EXPECT_EQ(error_of({"--seed", "-1"}), "--seed must be non-negative, got -1");
  EXPECT_NE(error_of({"--seed", "18446744073709551616"}).find("--seed: value out of range"), std::string::npos);
}

TEST(FlagParser, NumbersMustBeFinite) {
  for (const char* v : {"inf", "-inf", "nan", "NaN", "infinity", "-nan"}) {
    EXPECT_EQ(error_of({"--d", v}), std::string("--d must be a finite number, got '") + v + "'");
    EXPECT_EQ(error_of({"--f", v}), std::string("--f must be a finite number, got '") + v + "'");
  }
  EXPECT_NE(error_of({"--d", "1e999"}).find("--d: value out of range (got 1e999"), std::string::npos);
  EXPECT_NE(error_of({"--d", "-1e999"}).find("--d: value out of range"), std::string::npos);
}

TEST(FlagParser, FloatsMustSurviveTheConversion) {
  Flags f;
  EXPECT_EQ(error_of({"--f", "3e38", "--d", "1e300"}, &f), "");
  EXPECT_FLOAT_EQ(f.f, 3e38f);
  EXPECT_NE(error_of({"--f", "1e39"}).find("--f: value out of range (got 1e39"), std::string::npos);
  EXPECT_NE(error_of({"--f", "1e-50"}).find("--f: value out of range (got 1e-50"), std::string::npos);
  EXPECT_EQ(error_of({"--f", "0"}), "");
}

class FlagParserConfig : public testing::Test {
 protected:
  std::filesystem::path dir_ = std::filesystem::temp_directory_path() / ("mt_flag_parser_" + std::to_string(::getpid()));
  void SetUp() override { std::filesystem::create_directories(dir_); }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const auto p = (dir_ / name).string();
    std::ofstream(p) << text;
    return p;
  }
};

TEST_F(FlagParserConfig, AppliesAndTheCommandLineOverrides) {
  Flags f;
  const auto p = write("ok.yaml", "n: 3\nany: 7\non: true\npaths: [a, b]\nd: 0.25\n");
  EXPECT_EQ(error_of({"--config", p, "--any", "8"}, &f), "");
  EXPECT_EQ(f.n, 3);
  EXPECT_EQ(f.any, 8);
  EXPECT_TRUE(f.on);
  EXPECT_EQ(f.paths, (std::vector<std::string>{"a", "b"}));
  EXPECT_DOUBLE_EQ(f.d, 0.25);
}

TEST_F(FlagParserConfig, EveryShapeOfMistakeIsOneError) {
  struct Case {
    const char* yaml;
    const char* needle;
  };
  for (const Case& c : std::vector<Case>{
           {"paths: [[a, b]]\n", "--paths: list entries must be plain values"},
           {"paths: [{a: b}]\n", "--paths: list entries must be plain values"},
           {"[a, b]: 3\n", "keys must be flag names"},
           {"{a: 1}: 3\n", "keys must be flag names"},
           {"on: [1]\n", "--on is a switch: use true or false"},
           {"on: {a: 1}\n", "--on is a switch: use true or false"},
           {"on: maybe\n", "--on is a switch: use true or false"},
           {"n: {a: 1}\n", "--n must be a scalar or a list"},
           {"n: [1, 2]\n", "--n takes one value"},
           {"n: 99\n", "--n: value out of range (got 99; expected 1 to 10)"},
           {"d: .inf\n", "--d expects a number, got '.inf'"},
           {"d: 1e999\n", "--d: value out of range"},
           {"nope: 1\n", "unknown flag --nope"},
           {"- 1\n- 2\n", "must be a mapping of flag names to values"},
           {"n: [1, 2\n", "is not valid YAML"},
           {"a: &x [1]\nb: *y\n", "is not valid YAML"},
       }) {
    const auto p = write("bad.yaml", c.yaml);
    const std::string e = error_of({"--config", p});
    EXPECT_NE(e.find(c.needle), std::string::npos) << c.yaml << " -> " << e;
    EXPECT_NE(e.find(p), std::string::npos) << "names the file: " << e;
  }
}

TEST_F(FlagParserConfig, DeepNestingIsRefusedNotACrash) {
  const auto p = write("deep.yaml", "paths: " + std::string(100000, '[') + std::string(100000, ']') + "\n");
  EXPECT_NE(error_of({"--config", p}).find("--config"), std::string::npos);
}

TEST_F(FlagParserConfig, OnlyRegularFiles) {
  EXPECT_NE(error_of({"--config", dir_.string()}).find("is a directory"), std::string::npos);
  const auto fifo = (dir_ / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_NE(error_of({"--config", fifo}).find("is not a regular file"), std::string::npos);  // and does not hang
  EXPECT_NE(error_of({"--config", (dir_ / "missing.yaml").string()}).find("cannot read"), std::string::npos);
}

}  // namespace
}  // namespace mt
