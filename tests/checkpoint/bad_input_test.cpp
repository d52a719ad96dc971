// Hostile and careless checkpoint input (issue #27): metadata.json pieces, state.json counts, HF
// config.json fields and safetensors headers are validated before use and refused with an error
// naming the file and the key; temporary files are never written through a planted link;
// Megatron's "release" tracker loads SAVE/release/; a vocabulary padded to another multiple
// loads its true rows.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_config.h"
#include "checkpoint/io_util.h"
#include "checkpoint/metadata.h"
#include "checkpoint/model_args.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "model/gpt_model.h"
#include "support/error_of.h"
#include "support/tiny_training.h"
#include "training/trainer.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path fresh(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("mt_badin_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

using test::error_of;

#define EXPECT_ERROR(call, needle)                                                   \
  do {                                                                               \
    const std::string msg_ = error_of([&] { (void)(call); });                        \
    EXPECT_NE(msg_.find(needle), std::string::npos) << "got: '" << msg_ << "'";      \
  } while (0)

// --- metadata.json ---------------------------------------------------------------------------

json good_metadata() {
  return json::parse(R"({"format": "megatron.cpp-native", "version": 2, "iteration": 3,
    "layout": {"world": 1, "tp": 1, "pp": 1, "dp": 1},
    "files": {"model.safetensors": {"crc32": 1234, "bytes": 100}},
    "tensors": {"w": {"shape": [4, 6], "pieces": [
      {"file": "model.safetensors", "key": "w#0", "offset": [0, 0], "extent": [2, 6], "flat": [0, 12]},
      {"file": "model.safetensors", "key": "w#1", "offset": [2, 0], "extent": [2, 6], "flat": [0, 12]}]}},
    "rng": [{"rank": 0, "seed": 1, "offset": 2, "tp_seed": 3, "tp_offset": 4}]})");
}

TEST(BadMetadata, EveryPieceFieldIsCheckedAgainstItsTensor) {
  auto parse = [](const json& j) { return checkpoint::parse_metadata(j, "/c/metadata.json"); };
  const auto md = parse(good_metadata());
  ASSERT_EQ(md.tensors.at("w").pieces.size(), 2u);
  EXPECT_EQ(md.rng.at(0).tp_offset, 4u);
  auto piece = [](json& j) -> json& { return j["tensors"]["w"]["pieces"][1]; };
  json j = good_metadata();
  piece(j)["offset"] = json::array();  // was a SIGSEGV
  EXPECT_ERROR(parse(j), "'/c/metadata.json': tensor 'w' piece 1: offset must hold 2 integers");
  j = good_metadata();
  piece(j)["extent"] = {3, 6};
  EXPECT_ERROR(parse(j), "reaches past the tensor's dimension 0 of 4");
  j = good_metadata();
  piece(j)["offset"] = {-1, 0};
  EXPECT_ERROR(parse(j), "offset[0] must be an integer >= 0, got -1");
  j = good_metadata();
  piece(j)["flat"] = {0, 13};
  EXPECT_ERROR(parse(j), "flat[1] must be an integer between 0 and 12, got 13");
  j = good_metadata();
  piece(j)["flat"] = {5, 4};
  EXPECT_ERROR(parse(j), "flat range [5, 4] is reversed");
  j = good_metadata();
  piece(j)["flat"] = {0.5, 4};
  EXPECT_ERROR(parse(j), "flat[0] must be an integer, got 0.5");
  j = good_metadata();
  piece(j)["file"] = "optimizer.safetensors";
  EXPECT_ERROR(parse(j), "is in file 'optimizer.safetensors', which the checkpoint's files do not list");
  j = good_metadata();
  j["tensors"]["w"]["shape"] = {int64_t{1} << 62, 4};
  EXPECT_ERROR(parse(j), "is too large");
  j = good_metadata();
  j["tensors"]["w"]["pieces"] = "x";
  EXPECT_ERROR(parse(j), "pieces must be an array");
  j = good_metadata();
  j["layout"]["tp"] = 0;
  EXPECT_ERROR(parse(j), "layout: tp must be an integer between 1 and");
  j = good_metadata();
  j["rng"][0]["seed"] = -1;
  EXPECT_ERROR(parse(j), "rng[0]: seed must be an integer between 0 and");
  j = good_metadata();
  j["version"] = 3;
  EXPECT_ERROR(parse(j), "newer than this megatron.cpp reads");
  EXPECT_ERROR(parse(json::array()), "expected a JSON object");
}

TEST(BadMetadata, FileNamesStayInsideTheCheckpoint) {
  for (const char* name : {"/dev/zero", "../outside.safetensors", "..", ".", "a/b", ""}) {
    json j = good_metadata();
    j["files"][name] = {{"crc32", 1}, {"bytes", 1}};
    SCOPED_TRACE(name);
    EXPECT_ERROR(checkpoint::parse_metadata(j, "m.json"), "points outside the checkpoint directory");
  }
  json j = good_metadata();
  j["files"]["model.safetensors"]["crc32"] = int64_t{1} << 33;
  EXPECT_ERROR(checkpoint::parse_metadata(j, "m.json"), "crc32 must be an integer between 0 and 4294967295");
}

// --- state.json ------------------------------------------------------------------------------

json good_state() {
  json s = json::parse(R"({"iteration": 10, "consumed_train_samples": 40, "consumed_valid_samples": 0,
    "optimizer_steps": 9, "scheduler_samples": 36, "has_optimizer": true, "has_rng": true, "rng_seed": 1234,
    "rng_offset": 77, "skipped_iterations": 1, "nan_iterations": 1,
    "grad_scaler": {"scale": 1024.0, "growth_tracker": 3, "hysteresis_tracker": -1}})");
  const Arguments args = test::tiny_llama_args();
  s["args"] = checkpoint::model_args_to_json(args.model, args.tokenizer);
  s["args"]["ffn_hidden_size"] = 64;  // as finalize() leaves them
  s["args"]["kv_channels"] = 8;
  s["args"]["vocab_size"] = 48;
  s["args"]["orig_vocab_size"] = 40;
  return s;
}

TEST(BadState, CountsAreTypedRangedAndAgreeWithTheTracker) {
  auto parse = [](const json& j, int64_t it = 10) { return checkpoint::parse_state(j, "/c/state.json", it); };
  // good_state() with one key (of args, when `arg`) set to `v`.
  auto with = [](const char* key, const json& v, bool arg = false) {
    json j = good_state();
    (arg ? j["args"] : j)[key] = v;
    return j;
  };
  EXPECT_EQ(parse(good_state()).scheduler_samples, 36);
  EXPECT_EQ(parse(good_state(), checkpoint::kReleaseIteration).iteration, 10);  // release: any iteration
  // -5 trained iterations -4...12 while the log said 10; 1e15 exited 0 without training.
  EXPECT_ERROR(parse(with("iteration", -5)),
               "'/c/state.json': iteration must be an integer between 0 and 1000000000000, got -5");
  EXPECT_ERROR(parse(with("iteration", 1e15)), "iteration must be an integer between 0 and 1000000000000, got 1e+15");
  EXPECT_ERROR(parse(good_state(), 7), "iteration is 10, but the checkpoint directory is iteration 7");
  EXPECT_ERROR(parse(with("optimizer_steps", 11)), "optimizer_steps must be an integer between 0 and 10, got 11");
  EXPECT_ERROR(parse(with("scheduler_samples", 41)), "scheduler_samples must be an integer between 0 and 40");
  EXPECT_ERROR(parse(with("consumed_train_samples", 40.5)), "consumed_train_samples must be an integer, got 40.5");
  EXPECT_ERROR(parse(with("rng_offset", -1)), "rng_offset must be an integer between 0 and");
  EXPECT_ERROR(parse(with("has_rng", 1)), "has_rng must be true or false, got 1");
  EXPECT_ERROR(parse(with("grad_scaler", {{"scale", 0}, {"growth_tracker", 0}, {"hysteresis_tracker", 0}})),
               "grad_scaler: scale must be positive");
  EXPECT_ERROR(parse(with("grad_scaler", {{"scale", 1e39}})), "grad_scaler: scale must be a number between");
  json j = good_state();
  j.erase("args");
  EXPECT_ERROR(parse(j), "'/c/state.json': key 'args' is missing");
  // The model arguments generate, logits and convert build the model from.
  EXPECT_ERROR(parse(with("num_layers", 1e9, true)),
               "'/c/state.json': args: num_layers must be an integer between 1 and 16384");
  EXPECT_ERROR(parse(with("hidden_size", 32.5, true)), "args: hidden_size must be an integer, got 32.5");
  EXPECT_ERROR(parse(with("num_query_groups", 3, true)),
               "num_attention_heads (4) must be divisible by num_query_groups (3)");
  EXPECT_ERROR(parse(with("orig_vocab_size", 49, true)), "args: orig_vocab_size must be an integer between 1 and 48");
  EXPECT_ERROR(parse(with("swiglu", "yes", true)), "args: swiglu must be true or false");
  EXPECT_ERROR(parse(with("norm_epsilon", 0, true)), "args: norm_epsilon must be positive");
}

// --- HF config.json --------------------------------------------------------------------------

const std::string kFixtures = std::string(MT_SOURCE_DIR) + "/tests/checkpoint/fixtures/";

TEST(BadHfConfig, EveryFieldIsTypedRangedAndNamed) {
  const json llama = checkpoint::parse_json_file(kFixtures + "llama2/config.json");
  const json gpt2 = checkpoint::parse_json_file(kFixtures + "gpt2/config.json");
  auto err = [](const json& base, const char* key, const json& v) {
    json j = base;
    if (v.is_discarded()) j.erase(key);
    else j[key] = v;
    return error_of([&] { checkpoint::parse_hf_config(j, "/m/config.json"); });
  };
  auto expect = [&](const json& base, const char* key, const json& v, const std::string& needle) {
    const std::string e = err(base, key, v);
    EXPECT_NE(e.find(needle), std::string::npos) << key << " = " << v.dump() << ": got '" << e << "'";
  };
  expect(llama, "num_attention_heads", 0, "/m/config.json: num_attention_heads must be an integer between 1 and");
  expect(llama, "num_hidden_layers", 1e9, "/m/config.json: num_hidden_layers must be an integer between 1 and");
  expect(llama, "intermediate_size", -1, "/m/config.json: intermediate_size must be an integer between 1 and");
  expect(llama, "hidden_size", 64.5, "/m/config.json: hidden_size must be an integer, got 64.5");
  expect(llama, "hidden_size", "32", "/m/config.json: hidden_size must be an integer, got \"32\"");
  expect(llama, "hidden_size", json(json::value_t::discarded), "/m/config.json: key 'hidden_size' is missing");
  expect(llama, "num_key_value_heads", 3, "num_attention_heads (4) must be divisible by num_key_value_heads (3)");
  expect(llama, "num_key_value_heads", 8, "num_key_value_heads must be an integer between 1 and 4");
  expect(llama, "head_dim", 0, "/m/config.json: head_dim must be an integer between 1 and");
  expect(llama, "vocab_size", 0, "/m/config.json: vocab_size must be an integer between 1 and");
  expect(llama, "max_position_embeddings", -4, "max_position_embeddings must be an integer between 1 and");
  expect(llama, "rms_norm_eps", 0, "/m/config.json: rms_norm_eps must be positive");
  expect(llama, "rms_norm_eps", 1e-50, "rms_norm_eps is too small for a 32-bit float");
  expect(llama, "partial_rotary_factor", 1.5, "partial_rotary_factor must be a number between 0 and 1");
  expect(llama, "tie_word_embeddings", 1, "tie_word_embeddings must be true or false, got 1");
  expect(llama, "hidden_act", 3, "hidden_act must be a string, got 3");
  expect(llama, "model_type", json::array(), "model_type must be a string, got an array of 0 elements");
  expect(llama, "dtype", 16, "/m/config.json: dtype must be a string, got 16");
  expect(llama, "rope_parameters", "x", "rope_parameters must be an object or null");
  expect(llama, "rope_parameters", json({{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 4.0}}),
         "high_freq_factor (4) must exceed low_freq_factor (4)");
  expect(llama, "rope_parameters", json({{"rope_theta", 0}}), "rope_parameters: rope_theta must be positive");
  json no_head_dim = llama;
  no_head_dim.erase("head_dim");
  expect(no_head_dim, "num_attention_heads", 5, "must be divisible by num_key_value_heads");
  no_head_dim["num_key_value_heads"] = 5;
  expect(no_head_dim, "num_attention_heads", 5, "hidden_size (32) must be divisible by num_attention_heads (5), or set head_dim");
  expect(gpt2, "n_head", 0, "/m/config.json: n_head must be an integer between 1 and");
  expect(gpt2, "n_head", 5, "n_embd (32) must be divisible by n_head (5)");
  expect(gpt2, "n_inner", 0.5, "n_inner must be an integer, got 0.5");
  expect(gpt2, "layer_norm_epsilon", -1, "layer_norm_epsilon must be a number between 0 and 1");
  // Integral floats are integers; null is the default.
  EXPECT_EQ(err(llama, "hidden_size", 32.0), "");
  EXPECT_EQ(err(llama, "num_key_value_heads", nullptr), "");
  EXPECT_EQ(err(gpt2, "n_inner", nullptr), "");
}

// --- safetensors -----------------------------------------------------------------------------

// A safetensors file image: the header as given, then `data` bytes.
std::vector<uint8_t> image(const std::string& header, size_t data) {
  std::vector<uint8_t> b(8 + header.size() + data, 0);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) b[static_cast<size_t>(i)] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(b.data() + 8, header.data(), header.size());
  return b;
}

std::string parse_error(const std::string& header, size_t data) {
  const auto b = image(header, data);
  return error_of([&] { checkpoint::parse_safetensors(b.data(), b.size(), "x.safetensors"); });
}

TEST(BadSafetensors, OffsetsMustTileTheDataExactly) {
  const std::string a = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  EXPECT_EQ(parse_error("{" + a + R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})", 12), "");
  auto expect = [](const std::string& h, size_t data, const std::string& needle) {
    const std::string e = parse_error(h, data);
    EXPECT_NE(e.find(needle), std::string::npos) << h << ": got '" << e << "'";
  };
  expect("{" + a + R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8,
         "'x.safetensors': tensor 'b' overlaps the bytes of another tensor");
  expect("{" + a + R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})", 16,
         "4 bytes before tensor 'b' belong to no tensor");
  expect("{" + a + "}", 12, "4 bytes after the last tensor belong to no tensor");
  expect("{" + a + "}", 4, "tensor 'a' has data offsets [0, 8] outside the 4 data bytes");
  expect(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8, "data offsets [8, 0] outside");
  expect(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,-8]}})", 8, "data_offsets[1] must be an integer >= 0");
  expect(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8, "data_offsets must hold 2 integers");
  expect(R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}})", 8, "is too large");
  expect(R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8, "shape[0] must be an integer, got 2.5");
  expect(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, "shape[0] must be an integer >= 0");
  expect(R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8, "tensor 'a' dtype: unsupported safetensors dtype 'F64'");
  expect(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, "holds 8 bytes but its shape [3] of F32 needs 12");
  expect(R"({"__metadata__":7})", 0, "__metadata__ must be an object of strings");
  expect(R"({"a":5})", 0, "tensor 'a': expected a JSON object");
  expect("[]", 0, "not a JSON object");
  // A header length past the end of the file.
  auto b = image("{}", 0);
  b[3] = 1;
  EXPECT_NE(error_of([&] { checkpoint::parse_safetensors(b.data(), b.size(), "x"); }).find("corrupt safetensors header"),
            std::string::npos);
}

TEST(BadSafetensors, IntegerTensorsAreNotReadAsFloats) {
  const fs::path d = fresh("i32");
  fs::create_directories(d);
  const std::vector<int32_t> v{1, 2, 3, 4};
  checkpoint::write_safetensors((d / "m.safetensors").string(), {{"w", DType::I32, {2, 2}, v.data(), 16}});
  checkpoint::SafetensorsFile f((d / "m.safetensors").string());
  std::vector<float> out(4);
  EXPECT_ERROR(f.read_f32("w", {2, 2}, out.data()),
               "tensor 'w' in '" + (d / "m.safetensors").string() + "' is stored as I32, but it is a float parameter");
  fs::remove_all(d);
}

// --- files ----------------------------------------------------------------------------------

TEST(CheckpointFiles, TemporaryFilesAreNeverWrittenThroughALink) {
  const fs::path d = fresh("link");
  fs::create_directories(d);
  { std::ofstream(d / "victim") << "precious"; }
  fs::create_symlink(d / "victim", d / "tracker.txt.tmp");
  checkpoint::write_text_durable(d / "tracker.txt", "12");
  EXPECT_EQ(checkpoint::read_text(d / "victim"), "precious");
  EXPECT_EQ(checkpoint::read_text(d / "tracker.txt"), "12");
  EXPECT_FALSE(fs::is_symlink(d / "tracker.txt"));
  // The same for safetensors files (written into a directory made for the save).
  fs::create_symlink(d / "victim", d / "model.safetensors");
  const float x = 1.f;
  checkpoint::write_safetensors((d / "model.safetensors").string(), {{"x", DType::F32, {1}, &x, 4}});
  EXPECT_EQ(checkpoint::read_text(d / "victim"), "precious");
  EXPECT_FALSE(fs::is_symlink(d / "model.safetensors"));
  fs::remove_all(d);
}

// --- loading ---------------------------------------------------------------------------------

Arguments tiny(const std::string& save = "", const std::string& load = "", int64_t vocab = 40,
               int64_t divisible = 16) {
  Arguments a = test::tiny_llama_args(save, load);
  a.make_vocab_size_divisible_by = divisible;
  validate_args(a, vocab);
  return a;
}

TEST(Release, TrackerReleaseLoadsTheReleaseDirectoryAsWeights) {
  const fs::path dir = fresh("release");
  std::vector<float> saved;
  {
    Trainer t(tiny(dir.string()), nullptr);
    t.set_data(std::make_unique<test::PatternSource>(16), nullptr);
    for (int i = 0; i < 2; ++i) t.train_step();
    t.save();
  }
  fs::rename(checkpoint::iteration_dir(dir.string(), 2), dir / "release");
  { std::ofstream(dir / "latest_checkpointed_iteration.txt") << "release\n"; }
  EXPECT_EQ(*checkpoint::latest_iteration(dir.string()), checkpoint::kReleaseIteration);
  EXPECT_EQ(checkpoint::iteration_dir(dir.string(), checkpoint::kReleaseIteration), (dir / "release").string());
  Trainer r(tiny("", dir.string()), nullptr);
  r.load_for_test();
  EXPECT_EQ(r.state().iteration, 0);  // Megatron: a release checkpoint starts training afresh
  checkpoint::CheckpointReader reader(dir.string(), checkpoint::kReleaseIteration);
  const auto& p = r.model().params().params().front();
  const auto want = reader.read(p.name);
  const float* got = r.model().params().main_buffer().data<float>() + p.offset;
  EXPECT_TRUE(std::equal(want.begin(), want.end(), got)) << p.name;
  fs::remove_all(dir);
}

TEST(VocabPadding, TrueRowsLoadIntoAnotherPaddingAndThePaddingIsZero) {
  const fs::path dir = fresh("vocab");
  Arguments a = tiny("", "", 600, 128);  // 640 rows
  ASSERT_EQ(a.model.vocab_size, 640);
  model::GPTModel m(a.model);
  checkpoint::TrainingState st;
  st.iteration = 1;
  st.args = checkpoint::model_args_to_json(a.model, a.tokenizer);
  checkpoint::save_checkpoint(dir.string(), st, m.params(), nullptr);
  const float* saved = m.params().main_buffer().data<float>();

  Arguments b = tiny("", "", 600, 256);  // 768 rows
  model::GPTModel n(b.model);
  checkpoint::LoadOptions lo;
  lo.load_optim = false;
  lo.orig_vocab_size = 600;
  testing::internal::CaptureStdout();
  checkpoint::load_checkpoint(dir.string(), 1, n.params(), nullptr, lo);
  const std::string log = testing::internal::GetCapturedStdout();
  size_t said = 0;
  for (size_t p = log.find("true rows and zero padding"); p != std::string::npos; p = log.find("true rows", p + 1)) ++said;
  EXPECT_EQ(said, 1u) << log;  // once, though two tensors were re-padded
  for (const char* name : {"embedding.word_embeddings.weight", "output_layer.weight"}) {
    const model::Param* p = m.params().find(name);
    const model::Param* q = n.params().find(name);
    ASSERT_TRUE(p && q) << name;
    const int64_t h = p->full_shape[1];
    const float* x = saved + p->offset;
    const float* y = n.params().main_buffer().data<float>() + q->offset;
    EXPECT_TRUE(std::equal(x, x + 600 * h, y)) << name << ": the true rows";
    EXPECT_TRUE(std::all_of(y + 600 * h, y + 768 * h, [](float v) { return v == 0.f; })) << name << ": the padding";
  }
  // A model of another true vocabulary is another model.
  Arguments c = tiny("", "", 601, 256);
  model::GPTModel o(c.model);
  lo.orig_vocab_size = 601;
  EXPECT_ERROR(checkpoint::load_checkpoint(dir.string(), 1, o.params(), nullptr, lo),
               "has a vocabulary of 600 tokens, the model 601");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace mt
