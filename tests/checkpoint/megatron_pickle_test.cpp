// The restricted unpickler and the torch.save / DCP readers of Megatron-LM checkpoints: hostile
// pickles are refused by name without running anything, and the real fixtures written by
// Megatron-LM (tests/fixtures/megatron_ckpt) parse into the tensors and state they hold.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "checkpoint/megatron/dcp.h"
#include "checkpoint/megatron/dcp_writer.h"
#include "checkpoint/megatron/megatron_import.h"
#include "checkpoint/megatron/pickle.h"
#include "core/error.h"

namespace mt::checkpoint {
namespace {

using namespace std::string_literals;

const std::string kFix = std::string(MT_SOURCE_DIR) + "/tests/fixtures/megatron_ckpt/";

// A little-endian 4-byte length or integer, as pickle writes them.
std::string le32(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}
// The pieces joined (appending in place: GCC 12 warns falsely on chains of string operator+).
std::string cat(std::initializer_list<std::string> parts) {
  std::string out;
  for (const auto& p : parts) out.append(p);
  return out;
}
// BINUNICODE of `s`.
std::string str(const std::string& s) { return cat({"X", le32(static_cast<uint32_t>(s.size())), s}); }

pickle::Pickle parse_str(const std::string& s, const pickle::Limits& lim = {}) {
  return pickle::parse(reinterpret_cast<const uint8_t*>(s.data()), s.size(), "test.pkl", lim);
}

// Expects parse to throw mt::Error whose message holds `needle`.
void expect_refused(const std::string& bytes, const std::string& needle, const pickle::Limits& lim = {}) {
  try {
    parse_str(bytes, lim);
    FAIL() << "accepted; wanted an error holding: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(MegatronPickle, RefusesOsSystemByName) {
  // Protocol 2 (GLOBAL) and protocol 4 (STACK_GLOBAL) spellings of os.system('echo pwned').
  expect_refused(cat({"cos\nsystem\n(", str("echo pwned"), "tR."}), "os.system");
  expect_refused("\x80\x04\x8c\x02os\x8c\x06system\x93\x8c\x04true\x85R."s, "os.system");
}

TEST(MegatronPickle, RefusesGlobalsOutsideTheAllowList) {
  expect_refused("c__builtin__\neval\n.", "__builtin__.eval");
  expect_refused("cbuiltins\ngetattr\n.", "builtins.getattr");
  expect_refused("ctorch\nload\n.", "torch.load");
  // A near miss of an allowed name is still refused.
  expect_refused("ccollections\nOrderedDictX\n.", "collections.OrderedDictX");
  EXPECT_TRUE(pickle::allowed_global("torch._utils", "_rebuild_tensor_v2"));
  EXPECT_FALSE(pickle::allowed_global("subprocess", "Popen"));
}

TEST(MegatronPickle, RefusesRecursiveStructures) {
  // l = []; l.append(l)
  expect_refused("]q\x00h\x00" "a."s, "recursive");
  // d = {}; d['k'] = d
  expect_refused(cat({"}q\x00"s, str("k"), "h\x00s."s}), "recursive");
}

TEST(MegatronPickle, RefusesOversizedLengths) {
  // A string claiming 2 GiB, a bytes object claiming 4 GiB - 1, in a tiny file.
  expect_refused("X\xff\xff\xff\x7f" "abc."s, "reaches past the end");
  expect_refused("B\xff\xff\xff\xff" "."s, "reaches past the end");
  // A memo index far past the limit, an integer wider than 64 bits.
  expect_refused("Nr\xff\xff\xff\xff."s, "memo index");
  expect_refused("\x8a\x09" "123456789."s, "more than 64 bits");
}

TEST(MegatronPickle, RefusesDeepNestingAndTruncation) {
  std::string deep = ")";
  for (int i = 0; i < 300; ++i) deep += "\x85";  // TUPLE1 around the previous value
  deep += ".";
  expect_refused(deep, "nested more than");
  pickle::Limits small;
  small.max_nodes = 10;
  expect_refused("(NNNNNNNNNNNNt.", "more than 10 values", small);
  expect_refused("]", "truncated");
  expect_refused("\xff.", "opcode 0xff");
  expect_refused(")Na.", "APPEND applied to a value of another kind");
}

TEST(MegatronPickle, ParsesPlainValues) {
  // {'a': [1, -2, 3.5, True, None], 'b': (u'x', b'y')} in protocol 2 spellings.
  const std::string s = cat({"}(", str("a"), "](K\x01J", le32(0xfffffffeu), "G\x40\x0c\x00\x00\x00\x00\x00\x00"s,
                             "\x88Ne", str("b"), str("x"), "C\x01y\x86u."});
  pickle::Pickle p = parse_str(s);
  const int64_t a = p.get(p.root, "a");
  ASSERT_GE(a, 0);
  const auto& items = p.at(a).items;
  ASSERT_EQ(items.size(), 5u);
  EXPECT_EQ(p.at(items[0]).i, 1);
  EXPECT_EQ(p.at(items[1]).i, -2);
  EXPECT_DOUBLE_EQ(p.at(items[2]).f, 3.5);
  EXPECT_TRUE(p.at(items[3]).b);
  EXPECT_EQ(p.at(items[4]).kind, pickle::Kind::None);
  const int64_t b = p.get(p.root, "b");
  EXPECT_EQ(p.at(p.at(b).items[1]).kind, pickle::Kind::Bytes);
}

TEST(MegatronDcp, ReadsTheFixtureMetadataAndTensors) {
  megatron::DcpReader r(kFix + "ck_dist/iter_0000005");
  const auto& md = r.metadata();
  ASSERT_TRUE(r.has_tensor("decoder.layers.mlp.linear_fc1.weight"));
  const auto& fc1 = md.tensors.at("decoder.layers.mlp.linear_fc1.weight");
  EXPECT_EQ(fc1.dtype, "float32");
  EXPECT_EQ(fc1.size, (Shape{2, 256, 64}));
  EXPECT_EQ(fc1.chunks.size(), 4u);  // per layer: the gate and up halves of SwiGLU's fc1
  megatron::HostTensor t = r.read("decoder.layers.mlp.linear_fc1.weight");
  EXPECT_EQ(t.values.size(), 2u * 256 * 64);
  float sum = 0;
  for (float v : t.values) sum += v * v;
  EXPECT_GT(sum, 0.f);
  EXPECT_EQ(md.order.front(), "embedding.word_embeddings.weight");
}

TEST(MegatronImport, TorchDistAndTorchHoldTheSameCheckpoint) {
  // Megatron wrote both from the same deterministic run: the same weights and Adam state.
  megatron::Imported d = megatron::read_checkpoint(kFix + "ck_dist/iter_0000005", 5, true);
  megatron::Imported t = megatron::read_checkpoint(kFix + "ck_torch/iter_0000005", 5, true);
  EXPECT_EQ(d.state.iteration, 5);
  EXPECT_EQ(d.state.consumed_train_samples, 40);
  EXPECT_EQ(d.state.scheduler_samples, 40);
  EXPECT_EQ(d.state.optimizer_steps, 5);
  EXPECT_EQ(t.state.optimizer_steps, 5);
  EXPECT_EQ(d.state.args["num_query_groups"], 2);
  EXPECT_EQ(d.state.args["vocab_size"], 512);
  ASSERT_EQ(d.tensors.size(), t.tensors.size());
  for (const auto& [name, x] : d.tensors) {
    ASSERT_TRUE(t.tensors.count(name)) << name;
    EXPECT_EQ(x.shape, t.tensors.at(name).shape) << name;
    EXPECT_EQ(x.values, t.tensors.at(name).values) << name;
  }
  EXPECT_TRUE(d.tensors.count("decoder.layers.1.input_layernorm.weight"));
  EXPECT_TRUE(d.tensors.count("exp_avg_sq/decoder.layers.0.mlp.linear_fc1.weight"));
}

TEST(MegatronImport, DistributedOptimizerBuffersBecomeParameters) {
  megatron::Imported o = megatron::read_checkpoint(kFix + "ck_distopt/iter_0000005", 5, true);
  EXPECT_EQ(o.state.optimizer_steps, 5);
  EXPECT_TRUE(o.state.has_optimizer);
  EXPECT_EQ(o.tensors.at("exp_avg/output_layer.weight").shape, (Shape{512, 64}));
  EXPECT_EQ(o.tensors.at("decoder.layers.0.self_attention.linear_qkv.weight").shape, (Shape{128, 64}));
  // The weights are the fp32 main params: some are not bf16 values.
  bool wider = false;
  for (float v : o.tensors.at("decoder.layers.0.mlp.linear_fc2.weight").values) wider |= v != round_bf16(v);
  EXPECT_TRUE(wider);
}

}  // namespace
}  // namespace mt::checkpoint

namespace mt::checkpoint {
namespace {

// Writing torch_dist: what megatron.cpp writes reads back as the same checkpoint, and its layout
// (keys, shapes, dtypes, chunks) is the one Megatron-LM wrote, but for the RNG state it omits.
TEST(MegatronWrite, TorchDistRoundTripsWithTheFixtureLayout) {
  const std::string out = ::testing::TempDir() + "mt_torch_dist_" + std::to_string(::getpid());
  std::filesystem::remove_all(out);
  {
    CheckpointReader src(kFix + "ck_torch", 5);
    megatron::write_torch_dist(out, src);
  }
  EXPECT_EQ(latest_iteration(out), 5);
  megatron::DcpReader ours(out + "/iter_0000005"), theirs(kFix + "ck_dist/iter_0000005");
  EXPECT_EQ(ours.metadata().tensors.size(), theirs.metadata().tensors.size());
  for (const auto& [name, t] : theirs.metadata().tensors) {
    ASSERT_TRUE(ours.has_tensor(name)) << name;
    const auto& o = ours.metadata().tensors.at(name);
    EXPECT_EQ(o.dtype, t.dtype) << name;
    EXPECT_EQ(o.size, t.size) << name;
    ASSERT_EQ(o.chunks.size(), t.chunks.size()) << name;
    for (size_t c = 0; c < o.chunks.size(); ++c) {
      EXPECT_EQ(o.chunks[c].offsets, t.chunks[c].offsets) << name;
      EXPECT_EQ(o.chunks[c].sizes, t.chunks[c].sizes) << name;
    }
    EXPECT_EQ(ours.read(name).values, theirs.read(name).values) << name;  // the same run's state
  }
  for (const auto& [name, r] : theirs.metadata().bytes) {
    if (name.rfind("rng_state", 0) != 0) {
      EXPECT_TRUE(ours.metadata().bytes.count(name)) << name;
    }
  }
  megatron::Imported back = megatron::read_checkpoint(out + "/iter_0000005", 5, true);
  EXPECT_EQ(back.state.iteration, 5);
  EXPECT_EQ(back.state.optimizer_steps, 5);
  EXPECT_EQ(back.state.consumed_train_samples, 40);
  EXPECT_EQ(back.state.scheduler_samples, 40);
  EXPECT_EQ(back.state.args["megatron_opt_param_scheduler"]["lr_decay_steps"], 160);
  std::filesystem::remove_all(out);
}

}  // namespace
}  // namespace mt::checkpoint

namespace mt::checkpoint {
namespace {

// A .metadata claiming a tensor of 2^40 elements in a 16-byte data file is refused before
// anything is allocated for it.
TEST(MegatronDcp, RefusesATensorLargerThanItsChunks) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / ("mt_dcp_huge_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  { std::ofstream(dir / "__0_0.distcp") << std::string(16, 'x'); }
  pickle::Builder b;
  const std::string md = "torch.distributed.checkpoint.metadata";
  auto size = [&](int64_t v) { return b.call(b.global("torch", "Size"), {b.tuple({b.integer(v)})}); };
  const int64_t props = b.call(b.global(md, "TensorProperties"), {}, b.tuple({b.global("torch", "float32")}), true);
  const int64_t cs = b.dict();
  b.set(cs, "offsets", size(0));
  b.set(cs, "sizes", size(int64_t{1} << 40));
  const int64_t ts = b.dict();
  b.set(ts, "properties", props);
  b.set(ts, "size", size(int64_t{1} << 40));
  b.set(ts, "chunks", b.list({b.call(b.global(md, "ChunkStorageMetadata"), {}, cs, true)}));
  const int64_t sdm = b.dict();
  b.set(sdm, "w", b.call(b.global(md, "TensorStorageMetadata"), {}, ts, true));
  const int64_t mi = b.dict(), si = b.dict();
  b.set(mi, "fqn", b.str("w"));
  b.set(mi, "offset", size(0));
  b.set(si, "relative_path", b.str("__0_0.distcp"));
  b.set(si, "offset", b.integer(0));
  b.set(si, "length", b.integer(16));
  const int64_t sd = b.dict({b.call(b.global(md, "MetadataIndex"), {}, mi, true),
                             b.call(b.global("torch.distributed.checkpoint.filesystem", "_StorageInfo"), {}, si, true)});
  const int64_t top = b.dict();
  b.set(top, "state_dict_metadata", sdm);
  b.set(top, "storage_data", sd);
  { std::ofstream(dir / ".metadata") << pickle::serialize(b.pk, b.call(b.global(md, "Metadata"), {}, top, true)); }
  megatron::DcpReader r(dir.string());
  try {
    r.read("w");
    FAIL() << "a tensor of 2^40 elements in 16 bytes was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("its chunks hold 16 bytes"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace mt::checkpoint
