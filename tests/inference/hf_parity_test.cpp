// Greedy generation from the HF fixtures (tests/checkpoint/fixtures/<arch>) equals transformers'
// generate(): the expected tokens are tests/inference/fixtures/hf_greedy.json, made by
// tests/tools/hf_generate_fixture.py on a machine with torch + transformers.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/numpy_npy.h"
#include "engine_support.h"
#include "inference/model_runner.h"
#include "support/npy_f32.h"
#include "training/inference_load.h"

namespace fs = std::filesystem;

namespace mt::test {
namespace {

const std::string kFixture = std::string(MT_SOURCE_DIR) + "/tests/inference/fixtures/hf_greedy.json";

// Whether our tokens `got` agree with `want` (transformers'): equal, or parting at a near tie in
// our own fp32 logits (|difference| < 1e-3 between the two choices), where either answer is right.
std::string disagreement(model::GPTModel& m, std::vector<int32_t> ids, const std::vector<int32_t>& got,
                         const std::vector<int32_t>& want) {
  const int64_t Vp = m.config().vocab_size;
  for (size_t k = 0; k < want.size(); ++k) {
    if (k >= got.size()) return "only " + std::to_string(got.size()) + " tokens";
    if (got[k] != want[k]) {
      const int64_t T = static_cast<int64_t>(ids.size());
      const Tensor l = m.logits(ids, 1, T);
      const float* last = l.data<float>() + (T - 1) * Vp;
      if (std::fabs(last[got[k]] - last[want[k]]) < 1e-3f) return "";
      return "token " + std::to_string(k) + ": ours " + std::to_string(got[k]) + ", transformers' " +
             std::to_string(want[k]);
    }
    ids.push_back(want[k]);
  }
  return "";
}

// Every HF fixture (all architectures) through the engine's runner: the prompt rows of
// input_ids.npy, each in its own cache slot, prefilled as one batch in two chunks, give
// transformers' logits (logits.npy) at every position within 1e-4 of the largest logit.
TEST(InferenceHf, RunnerLogitsEqualTransformersForEveryFixture) {
  int checked = 0;
  for (const auto& e : fs::directory_iterator(std::string(MT_SOURCE_DIR) + "/tests/checkpoint/fixtures")) {
    const std::string dir = e.path().string();
    if (!fs::exists(dir + "/config.json") || !fs::exists(dir + "/logits.npy")) continue;
    const data::NpyArray ids = data::NpyArray::load(dir + "/input_ids.npy");
    std::vector<int64_t> shape;
    const std::vector<float> want = read_npy_f32(dir + "/logits.npy", &shape);
    const int64_t B = ids.shape()[0], T = ids.shape()[1], V = shape[2];
    InferenceModel im = load_inference_model(dir, -1, Device::CPU, false);
    inference::ModelRunner run(*im.model, B, T);
    std::vector<float> got(static_cast<size_t>(B * T * V));
    for (auto [t0, t1] : {std::pair<int64_t, int64_t>{0, T / 2}, {T / 2, T}}) {
      inference::StepBatch sb;
      std::vector<std::pair<int64_t, int64_t>> where;  // (b, t) of each logit row
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = t0; t < t1; ++t) {
          sb.tokens.push_back(static_cast<int32_t>(ids.at(b * T + t)));
          sb.slots.push_back(static_cast<int32_t>(b));
          sb.positions.push_back(static_cast<int32_t>(t));
          sb.logit_rows.push_back(static_cast<int32_t>(sb.tokens.size() - 1));
          where.emplace_back(b, t);
        }
      const Tensor l = run.forward(sb);
      ASSERT_EQ(l.dim(1), V) << dir;
      for (size_t r = 0; r < where.size(); ++r)
        std::copy_n(l.data<float>() + static_cast<int64_t>(r) * V, V,
                    got.begin() + (where[r].first * T + where[r].second) * V);
    }
    double d = 0, m = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      d = std::max(d, std::fabs(static_cast<double>(got[i]) - want[i]));
      m = std::max(m, std::fabs(static_cast<double>(want[i])));
    }
    EXPECT_LT(d / m, 1e-4) << dir;
    ++checked;
  }
  EXPECT_GE(checked, 9);
}

TEST(InferenceHf, GreedyTokensEqualTransformersGenerate) {
  if (!fs::exists(kFixture))
    GTEST_SKIP() << kFixture << " is absent: run tests/tools/hf_generate_fixture.py where torch + transformers are "
                 << "installed and commit its output";
  std::ifstream f(kFixture);
  const nlohmann::json doc = nlohmann::json::parse(f);
  const int64_t n = doc.at("max_new_tokens").get<int64_t>();
  ASSERT_FALSE(doc.at("models").empty());
  for (auto it = doc.at("models").begin(); it != doc.at("models").end(); ++it) {
    const std::string dir = std::string(MT_SOURCE_DIR) + "/tests/checkpoint/fixtures/" + it.key();
    ASSERT_TRUE(fs::exists(dir)) << dir;
    // The prompts are the fixture's own input ids.
    const data::NpyArray ids = data::NpyArray::load(dir + "/input_ids.npy");
    const auto prompts = it.value().at("input_ids").get<std::vector<std::vector<int32_t>>>();
    const auto want = it.value().at("greedy").get<std::vector<std::vector<int32_t>>>();
    ASSERT_EQ(static_cast<int64_t>(prompts.size()), ids.shape()[0]) << it.key();
    for (size_t b = 0; b < prompts.size(); ++b)
      for (size_t t = 0; t < prompts[b].size(); ++t)
        ASSERT_EQ(prompts[b][t], ids.at(static_cast<int64_t>(b * prompts[b].size() + t))) << it.key();
    InferenceModel im = load_inference_model(dir, -1, Device::CPU, false);
    std::vector<inference::Request> reqs;
    for (const auto& p : prompts) {
      inference::Request r;
      r.prompt = p;
      r.max_new_tokens = n;
      reqs.push_back(r);
    }
    inference::EngineOptions o;
    o.max_batch = static_cast<int64_t>(reqs.size());
    const auto got = run_engine(*im.model, reqs, o);
    for (size_t b = 0; b < reqs.size(); ++b)
      EXPECT_EQ(disagreement(*im.model, prompts[b], got[b].tokens, want[b]), "") << it.key() << " prompt " << b;
  }
}

}  // namespace
}  // namespace mt::test
