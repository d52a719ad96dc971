// HuggingFace interchange against fixtures made by transformers itself (fixtures/make_fixtures.py):
// tiny random-init Llama 2, Llama 3.1 (llama3 rope scaling, bf16, 4.x-style config), Mistral
// (fp16), Qwen2 (qkv bias, tied, sharded index), Qwen3 (q/k norm, head_dim != hidden/heads) and
// GPT-2 (Conv1D, tied, learned positions), and the mixture-of-experts Mixtral (bf16), Qwen2-MoE
// (gated shared expert, a dense layer, unnormalised top-k) and Qwen3-MoE. Our fp32 logits match
// transformers' within 1e-4 relative; HF -> native -> HF gives back every tensor bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_config.h"
#include "checkpoint/hf_weights.h"
#include "checkpoint/io_util.h"
#include "core/error.h"
#include "support/npy_f32.h"
#include "training/commands.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
using test::read_npy_f32;

const std::string kFixtures = std::string(MT_SOURCE_DIR) + "/tests/checkpoint/fixtures/";

fs::path tmp(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("mt_hf_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

double max_rel_diff(const std::vector<float>& got, const std::vector<float>& want) {
  double d = 0, m = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    d = std::max(d, std::fabs(static_cast<double>(got[i]) - want[i]));
    m = std::max(m, std::fabs(static_cast<double>(want[i])));
  }
  return d / m;
}

class HfArch : public ::testing::TestWithParam<std::string> {};

TEST_P(HfArch, LogitsMatchTransformers) {
  const std::string dir = kFixtures + GetParam();
  const fs::path out = tmp(GetParam()).string() + ".npy";
  ASSERT_EQ(logits_main({"--load", dir, "--input-ids", dir + "/input_ids.npy", "--output", out.string()}), 0);
  std::vector<int64_t> shape;
  auto got = read_npy_f32(out.string(), &shape), want = read_npy_f32(dir + "/logits.npy");
  EXPECT_EQ(shape, (std::vector<int64_t>{2, 8, 100}));
  ASSERT_EQ(got.size(), want.size());
  const double rel = max_rel_diff(got, want);
  EXPECT_LT(rel, 1e-4) << GetParam();
  std::printf("[ hf ] %s: logits max difference %.2e relative to the largest logit\n", GetParam().c_str(), rel);
  fs::remove(out);
}

TEST_P(HfArch, RoundTripIsBitExactAndReshardedLoadMatches) {
  const std::string dir = kFixtures + GetParam();
  const fs::path base = tmp(GetParam()), native = base / "native", back = base / "hf";
  ASSERT_EQ(convert_main({"--from", "hf", "--input", dir, "--output", native.string(), "--target-tensor-parallel-size",
                          "2"}),
            0);
  // The native checkpoint gives the same logits.
  const fs::path out = base / "l.npy";
  ASSERT_EQ(logits_main({"--load", native.string(), "--input-ids", dir + "/input_ids.npy", "--output", out.string()}), 0);
  EXPECT_LT(max_rel_diff(read_npy_f32(out.string()), read_npy_f32(dir + "/logits.npy")), 1e-4);
  ASSERT_EQ(convert_main({"--from", "megatron", "--to", "hf", "--input", native.string(), "--output", back.string()}), 0);

  checkpoint::HfSpec sa = checkpoint::read_hf_config(dir), sb = checkpoint::read_hf_config(back.string());
  EXPECT_EQ(sa.arch, sb.arch);
  EXPECT_EQ(sa.dtype, sb.dtype);
  EXPECT_EQ(sa.v5_style, sb.v5_style);
  EXPECT_EQ(sa.cfg.rope_scaling, sb.cfg.rope_scaling);
  EXPECT_EQ(sa.cfg.rotary_base, sb.cfg.rotary_base);
  EXPECT_EQ(sa.cfg.num_query_groups, sb.cfg.num_query_groups);
  EXPECT_EQ(sa.cfg.untie_embeddings_and_output_weights, sb.cfg.untie_embeddings_and_output_weights);
  EXPECT_EQ(sa.cfg.moe.num_experts, sb.cfg.moe.num_experts);
  EXPECT_EQ(sa.cfg.moe.layer_pattern, sb.cfg.moe.layer_pattern);
  EXPECT_EQ(sa.cfg.moe.pre_softmax, sb.cfg.moe.pre_softmax);
  EXPECT_EQ(sa.cfg.moe.shared_expert_intermediate_size, sb.cfg.moe.shared_expert_intermediate_size);
  // Every original tensor comes back with the same dtype, shape and bytes.
  auto raw = [](const std::string& d) {
    std::map<std::string, std::pair<std::string, std::string>> m;  // name -> (dtype+shape, bytes)
    for (const auto& e : fs::directory_iterator(d)) {
      if (e.path().extension() != ".safetensors") continue;
      checkpoint::SafetensorsFile f(e.path().string());
      for (const auto& n : f.names()) {
        const auto& t = f.entry(n);
        m[n] = {checkpoint::safetensors_dtype(t.dtype) + shape_to_string(t.shape),
                std::string(static_cast<const char*>(t.data), t.nbytes)};
      }
    }
    return m;
  };
  auto ra = raw(dir), rb = raw(back.string());
  EXPECT_EQ(ra.size(), rb.size());
  for (const auto& [n, v] : ra) {
    auto it = rb.find(n);
    ASSERT_NE(it, rb.end()) << n;
    EXPECT_EQ(v.first, it->second.first) << n;
    EXPECT_TRUE(v.second == it->second.second) << n << " differs";
  }
  fs::remove_all(base);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfArch,
                         ::testing::Values("llama2", "llama3", "mistral", "qwen2", "qwen3", "gpt2", "mixtral",
                                           "qwen2_moe", "qwen3_moe"));

TEST(HfConfig, BothTransformersStylesReadAndWrite) {
  // llama3's fixture is 4.x style (rope_theta, rope_scaling, torch_dtype); the others 5.x.
  auto old_style = checkpoint::read_hf_config(kFixtures + "llama3");
  EXPECT_FALSE(old_style.v5_style);
  EXPECT_TRUE(old_style.cfg.rope_scaling);
  EXPECT_EQ(old_style.cfg.rope_original_max_position, 256);
  EXPECT_EQ(old_style.cfg.rotary_base, 500000.0);
  EXPECT_EQ(old_style.dtype, DType::BF16);
  auto new_style = checkpoint::read_hf_config(kFixtures + "mistral");
  EXPECT_TRUE(new_style.v5_style);
  EXPECT_EQ(new_style.cfg.rotary_base, 1000000.0);
  EXPECT_EQ(new_style.dtype, DType::F16);
  // Written in the other style, read back the same.
  for (bool v5 : {false, true}) {
    auto j = checkpoint::make_hf_config(old_style, v5);
    EXPECT_EQ(j.contains("rope_parameters"), v5);
    EXPECT_EQ(j.contains("torch_dtype"), !v5);
    auto s = checkpoint::parse_hf_config(j, "written");
    EXPECT_EQ(s.v5_style, v5);
    EXPECT_TRUE(s.cfg.rope_scaling);
    EXPECT_EQ(s.cfg.rope_scaling_factor, 8.0);
    EXPECT_EQ(s.cfg.rope_high_freq_factor, 4.0);
    EXPECT_EQ(s.cfg.rotary_base, 500000.0);
    EXPECT_EQ(s.dtype, DType::BF16);
    EXPECT_EQ(j["rms_norm_eps"].get<double>(), 1e-5);
  }
}

TEST(HfConfig, UnsupportedModelsAreNamed) {
  auto j = checkpoint::read_hf_config(kFixtures + "llama2").raw;
  auto err = [](const nlohmann::json& c) {
    try {
      checkpoint::parse_hf_config(c, "X/config.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  auto k = j;
  k["model_type"] = "deepseek_v3";
  EXPECT_NE(err(k).find("'deepseek_v3' is not supported"), std::string::npos);
  k["model_type"] = "falcon";
  EXPECT_NE(err(k).find("'falcon' is not supported"), std::string::npos);
  k = j;
  k["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 4.0}};
  EXPECT_NE(err(k).find("'yarn'"), std::string::npos);
  k = j;
  k.erase("hidden_size");
  EXPECT_NE(err(k).find("X/config.json"), std::string::npos);
}

TEST(HfImport, MissingTensorAndWrongShapeAreNamed) {
  const fs::path d = tmp("broken");
  fs::create_directories(d);
  fs::copy_file(kFixtures + "llama2/config.json", d / "config.json");
  // Drop one tensor from the weights.
  {
    checkpoint::SafetensorsFile f(kFixtures + "llama2/model.safetensors");
    std::vector<checkpoint::TensorEntry> keep;
    for (const auto& n : f.names())
      if (n != "model.layers.1.mlp.up_proj.weight") keep.push_back(f.entry(n));
    checkpoint::write_safetensors((d / "model.safetensors").string(), keep);
  }
  try {
    convert_main({"--from", "hf", "--input", d.string(), "--output", (d / "out").string()});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.1.mlp.up_proj.weight"), std::string::npos) << e.what();
  }
  // A config that says another shape names the tensor whose shape differs.
  auto cfg = checkpoint::parse_json_file(d / "config.json");
  cfg["intermediate_size"] = 48;
  std::ofstream(d / "config.json") << cfg.dump();
  fs::copy_file(kFixtures + "llama2/model.safetensors", d / "model.safetensors", fs::copy_options::overwrite_existing);
  try {
    convert_main({"--from", "hf", "--input", d.string(), "--output", (d / "out2").string()});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gate_proj"), std::string::npos) << e.what();
  }
  fs::remove_all(d);
}

}  // namespace
}  // namespace mt
