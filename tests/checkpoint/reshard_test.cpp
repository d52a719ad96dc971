// Sharded checkpoints reshard: a run saved under one TP/PP/DP/EP layout (with or without the
// distributed optimizer) resumes under another on the loss trajectory of an uninterrupted
// single-rank run (fp32: 1e-5 relative, as the equivalence tests), and bit-identically under
// its own layout. Ranks are forked processes over Gloo (tests/comm/multiprocess.h); the parent
// never starts OpenMP threads before forking.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_config.h"
#include "comm/multiprocess.h"
#include "core/error.h"
#include "kernels/cpu/threads.h"
#include "parallel/layout_support.h"
#include "parallel/process_groups.h"
#include "training/convert.h"
#include "training/trainer.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
constexpr int kFirst = 4, kRest = 4;
constexpr int32_t kVocab = 64;

// Sequences with some structure to learn, the same as the layout tests of tests/parallel train on.
using testing::PatternSource;

struct Layout {
  int world = 1, tp = 1, pp = 1;
  int ep = 1, etp = 1;  // expert parallel and expert TP sizes (MoE shape)
  bool dist_opt = false;
  bool gpt = false;  // GPT-2 shape: tied embeddings (a replica on the last pipeline stage), LayerNorm, biases
  bool moe = false;  // the Llama shape with MoE MLPs: 8 experts, top-2, load-balancing loss
  int64_t vocab = kVocab;   // the true vocabulary (the data uses the first kVocab ids)
  int64_t divisible = 16;   // --make-vocab-size-divisible-by
};

// Megatron's Llama shape (or GPT-2's), trained as the layout tests train (tests/parallel).
Arguments make_args(const Layout& l, const std::string& save, const std::string& load) {
  Arguments a;
  auto& m = a.model;
  m.num_layers = 4;
  m.hidden_size = 32;
  m.num_attention_heads = 8;
  m.seq_length = 16;
  m.ffn_hidden_size = 64;
  m.attention_dropout = m.hidden_dropout = 0.f;
  if (!l.gpt) {
    testing::set_query_groups(a, 4);
    test::use_llama_blocks(m);
  }
  if (l.moe) {
    m.moe.num_experts = 8;
    m.moe.topk = 2;
    m.moe.moe_ffn_hidden_size = 16;
    m.moe.aux_loss_coeff = 1e-2;
    m.moe.layer_pattern = {true, false, true, true};  // a dense layer between them
  }
  testing::set_short_run(a, kFirst + kRest, 2, 3e-3f, 3e-4);
  a.world_size = l.world;
  a.tensor_model_parallel_size = l.tp;
  a.pipeline_model_parallel_size = l.pp;
  a.expert_model_parallel_size = l.ep;
  a.expert_tensor_parallel_size = l.etp;
  a.sequence_parallel = l.tp > 1 && l.moe;  // MoE under TP routes sequence shards
  a.use_distributed_optimizer = l.dist_opt;
  a.ddp_bucket_size = l.dist_opt ? 3000 : 0;  // several buckets: owned slices cut through tensors
  a.make_vocab_size_divisible_by = l.divisible;
  a.save = save;
  a.load = load;
  validate_args(a, l.vocab);
  return a;
}

std::string tmp_root() {
  static std::string d = [] {
    std::string p = (fs::temp_directory_path() / ("mt_reshard_" + std::to_string(::getpid()))).string();
    fs::create_directories(p);
    return p;
  }();
  return d;
}

// Trains `steps` steps (after loading when `load` is set), saves when `save` is set; rank 0
// writes the losses to `out`. `groups` > 0 replaces make_args' query groups after validation
// (the model checks them against TP when it is built).
void run(const Layout& l, int steps, const std::string& save, const std::string& load, const std::string& out,
         int64_t groups = 0) {
  auto res = testing::run_ranks(
      l.world,
      [&](comm::World& w) {
        // One thread in the forked ranks: when this process already ran OpenMP regions (all
        // tests in one process), a child's OpenMP team of several threads would never start.
        cpu::set_num_threads(1);
        Arguments a = make_args(l, save, load);
        if (groups > 0) a.model.num_query_groups = groups;
        parallel::RankGrid grid(w.size(), l.tp, l.pp, 1, l.ep, l.etp);
        auto pg = w.size() > 1 ? parallel::build_process_groups(w, grid) : parallel::local_process_groups();
        Trainer t(a, nullptr, pg);
        t.set_data(std::make_unique<PatternSource>(100000, a.model.seq_length, kVocab), nullptr);
        t.load_for_test();
        std::ofstream f(out + "." + std::to_string(w.rank()));
        f.precision(17);
        for (int i = 0; i < steps; ++i) {
          auto r = t.train_step();
          f << r.loss_sum / r.tokens << "\n";
        }
        if (!save.empty()) t.save();
      },
      [] {
        testing::RankOptions o;
        o.env = {{"OMP_NUM_THREADS", "1"}};
        return o;
      }());
  for (size_t r = 0; r < res.size(); ++r)
    ASSERT_EQ(res[r].exit_code, 0) << "rank " << r << ": " << res[r].stderr_text;
}

// Every rank reports the global loss (summed over DP and PP); rank 0's file is read.
std::vector<double> losses(const std::string& out, int rank = 0) {
  std::ifstream f(out + "." + std::to_string(rank));
  std::vector<double> v;
  for (double x; f >> x;) v.push_back(x);
  return v;
}

// The uninterrupted single-rank run of each shape (computed once).
const std::vector<double>& reference(const Layout& shape) {
  static std::vector<double> ref[3];
  const int k = shape.moe ? 2 : shape.gpt ? 1 : 0;
  auto& r = ref[k];
  if (r.empty()) {
    const std::string out = tmp_root() + (k == 2 ? "/ref_moe" : k == 1 ? "/ref_gpt" : "/ref");
    run(Layout{.gpt = shape.gpt, .moe = shape.moe}, kFirst + kRest, "", "", out);
    r = losses(out);
  }
  return r;
}

void expect_close(const std::vector<double>& got, size_t from, const char* what, const Layout& shape) {
  const auto& ref = reference(shape);
  ASSERT_EQ(got.size(), static_cast<size_t>(kRest)) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_LT(std::fabs(got[i] - ref[from + i]) / std::fabs(ref[from + i]), 1e-5)
        << what << " step " << from + i + 1 << ": " << got[i] << " vs " << ref[from + i];
}

void save_then_resume(const Layout& saver, const std::vector<Layout>& loaders, const std::string& name) {
  const std::string dir = tmp_root() + "/" + name;
  fs::remove_all(dir);
  run(saver, kFirst, dir, "", dir + ".first");
  auto first = losses(dir + ".first");
  ASSERT_EQ(first.size(), static_cast<size_t>(kFirst));
  for (int i = 0; i < kFirst; ++i)
    EXPECT_LT(std::fabs(first[static_cast<size_t>(i)] - reference(saver)[static_cast<size_t>(i)]) /
                  reference(saver)[static_cast<size_t>(i)],
              1e-5);
  for (const auto& l : loaders) {
    const std::string out = dir + ".resumed";
    run(l, kRest, "", dir, out);
    const std::string what =
        fmt::format("saved tp{} pp{} ep{} world{}{} -> loaded tp{} pp{} ep{} world{}{}", saver.tp, saver.pp, saver.ep,
                    saver.world, saver.dist_opt ? " dist-opt" : "", l.tp, l.pp, l.ep, l.world, l.dist_opt ? " dist-opt" : "");
    expect_close(losses(out), kFirst, what.c_str(), saver);
  }
}

TEST(Reshard, TP2ToTP1AndDP2DistributedOptimizer) {
  save_then_resume({.world = 2, .tp = 2}, {{}, {.world = 2, .dist_opt = true}}, "tp2");
}

TEST(Reshard, DP2DistributedOptimizerToTP2AndTP1) {
  save_then_resume({.world = 2, .dist_opt = true}, {{.world = 2, .tp = 2}, {}}, "dp2");
}

TEST(Reshard, TP2xPP2ToTP1AndPP2xDP2) {
  save_then_resume({.world = 4, .tp = 2, .pp = 2}, {{}, {.world = 4, .pp = 2, .dist_opt = true}}, "tp2pp2");
}

TEST(Reshard, TiedEmbeddingPP2ToOneRankAndTP2) {
  save_then_resume({.world = 2, .pp = 2, .gpt = true}, {{.gpt = true}, {.world = 2, .tp = 2, .gpt = true}}, "gptpp2");
}

// MoE experts are named by their global index: a checkpoint saved with EP 2 (each rank writes its
// experts, optimizer state sharded over expert DP) loads into EP 1 and EP 4, with and without the
// distributed optimizer, under TP + SP, expert TP and pipeline stages.
TEST(Reshard, MoEEP2ToEP1AndEP4) {
  save_then_resume({.world = 2, .ep = 2, .moe = true},
                   {{.moe = true}, {.world = 4, .ep = 4, .dist_opt = true, .moe = true}}, "moe_ep2");
}

TEST(Reshard, MoEEP2xEDP2DistributedOptimizerToTP2ExpertTP2AndPP2) {
  save_then_resume({.world = 4, .ep = 2, .dist_opt = true, .moe = true},
                   {{.world = 2, .tp = 2, .etp = 2, .moe = true},
                    {.world = 4, .pp = 2, .ep = 2, .moe = true},
                    {.world = 4, .tp = 2, .ep = 2, .dist_opt = true, .moe = true}},
                   "moe_ep2_edp2");
}

// TP 2 + SP with expert TP 1 and the distributed optimizer: dense state whole on each TP rank
// (DP 1), the experts' sharded over the expert-DP group that the TP ranks form.
TEST(Reshard, MoETP2ExpertDP2DistributedOptimizerToOneRankAndEP2) {
  save_then_resume({.world = 2, .tp = 2, .dist_opt = true, .moe = true},
                   {{.moe = true}, {.world = 2, .ep = 2, .dist_opt = true, .moe = true}}, "moe_tp2_edp2");
}

TEST(Reshard, SameLayoutResumesBitIdentically) {
  const Layout l{.world = 2, .tp = 2};
  const std::string dir = tmp_root() + "/same";
  fs::remove_all(dir);
  run(l, kFirst + kRest, "", "", dir + ".full");
  run(l, kFirst, dir, "", dir + ".first");
  run(l, kRest, "", dir, dir + ".rest");
  auto full = losses(dir + ".full"), rest = losses(dir + ".rest");
  ASSERT_EQ(rest.size(), static_cast<size_t>(kRest));
  for (int i = 0; i < kRest; ++i) EXPECT_EQ(rest[static_cast<size_t>(i)], full[static_cast<size_t>(kFirst + i)]) << i;
  // Every rank wrote its part; only one metadata file describes them.
  EXPECT_TRUE(fs::exists(fs::path(checkpoint::iteration_dir(dir, kFirst)) / "model-tp1-pp0.safetensors"));
  EXPECT_FALSE(fs::exists(fs::path(checkpoint::iteration_dir(dir, kFirst)) / "rank-00000.json"));
}

// Trains 3 steps from the HF fixture `name` (--load HF_DIR) on `l.world` ranks; rank r's losses
// go to out.r. MoE fixtures take l.ep / l.etp; under TP, SP.
void train_from_hf(const std::string& name, const Layout& l, const std::string& out) {
  const std::string hf = std::string(MT_SOURCE_DIR) + "/tests/checkpoint/fixtures/" + name;
  auto res = testing::run_ranks(l.world, [&](comm::World& w) {
    cpu::set_num_threads(1);  // see run()
    Arguments a;
    a.load = hf;
    apply_hf_config(a, checkpoint::read_hf_config(hf), hf);
    a.model.seq_length = 16;
    a.model.attention_dropout = a.model.hidden_dropout = 0.f;
    // The same padded vocabulary (128) at TP 1 and 2: the zero padding rows' logits take part
    // in the softmax, as in Megatron, so the padding must not change with the layout here.
    a.make_vocab_size_divisible_by = 64;
    a.data.mock = true;
    a.micro_batch_size = 2;
    a.global_batch_size = 4;
    a.train_iters = 3;
    a.optimizer.lr = 1e-3f;
    a.eval_iters = 0;
    a.world_size = l.world;
    a.tensor_model_parallel_size = l.tp;
    a.expert_model_parallel_size = l.ep;
    a.expert_tensor_parallel_size = l.etp;
    a.sequence_parallel = l.tp > 1 && a.model.moe.enabled();
    validate_args(a, 99);
    apply_hf_vocab(a, checkpoint::read_hf_config(hf), 99, hf);
    parallel::RankGrid grid(w.size(), l.tp, 1, 1, l.ep, l.etp);
    auto pg = w.size() > 1 ? parallel::build_process_groups(w, grid) : parallel::local_process_groups();
    Trainer t(a, nullptr, pg);
    t.set_data(std::make_unique<PatternSource>(100000, 16, kVocab), nullptr);
    t.load_for_test();
    std::ofstream f(out + "." + std::to_string(w.rank()));
    f.precision(17);
    for (int i = 0; i < 3; ++i) {
      auto r = t.train_step();
      f << r.loss_sum / r.tokens << "\n";
    }
  });
  for (size_t r = 0; r < res.size(); ++r) ASSERT_EQ(res[r].exit_code, 0) << res[r].stderr_text;
}

// The fixture trains under `l` as on one rank.
void expect_hf_layout_like_one_rank(const std::string& name, const Layout& l) {
  const std::string out = tmp_root() + "/hf_" + name;
  ASSERT_NO_FATAL_FAILURE(train_from_hf(name, {}, out + "1"));
  ASSERT_NO_FATAL_FAILURE(train_from_hf(name, l, out + "n"));
  auto one = losses(out + "1"), n = losses(out + "n");
  ASSERT_EQ(one.size(), 3u);
  ASSERT_EQ(n.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_LT(std::fabs(one[i] - n[i]) / one[i], 1e-5) << i << ": " << one[i] << " vs " << n[i];
}

// --load HF_DIR under tensor parallelism: Qwen3's q/k norms are shared by all heads, so their
// gradients are partial per TP rank and must be summed; TP 2 trains like one rank.
TEST(Reshard, HuggingFaceQwen3LoadsUnderTP2AndTrainsLikeOneRank) {
  expect_hf_layout_like_one_rank("qwen3", {.world = 2, .tp = 2});
}

// HF MoE models under expert parallelism: each rank takes its experts from the HF files (the
// others' are left for them); Qwen2-MoE's gated shared expert under TP 2 + SP with expert TP 2.
TEST(Reshard, HuggingFaceMixtralLoadsUnderEP2AndTrainsLikeOneRank) {
  expect_hf_layout_like_one_rank("mixtral", {.world = 2, .ep = 2});
}
TEST(Reshard, HuggingFaceQwen2MoELoadsUnderTP2ExpertTP2AndTrainsLikeOneRank) {
  expect_hf_layout_like_one_rank("qwen2_moe", {.world = 2, .tp = 2, .etp = 2});
}

// TP larger than --num-query-groups (Megatron's KV replication): linear_qkv stays a plain
// contiguous row split of the group-interleaved weight (blocks 1) whatever TP, so a TP 4 run
// with 2 query groups saves a checkpoint that TP 2 (whole groups) and one rank resume on the
// single-rank trajectory.
TEST(Reshard, TP4WithTwoQueryGroupsToTP2AndTP1) {
  const std::string dir = tmp_root() + "/tp4g2";
  fs::remove_all(dir);
  run({}, kFirst + kRest, "", "", dir + ".ref", 2);
  const auto ref = losses(dir + ".ref");
  ASSERT_EQ(ref.size(), static_cast<size_t>(kFirst + kRest));
  run({.world = 4, .tp = 4}, kFirst, dir, "", dir + ".first", 2);
  const auto first = losses(dir + ".first");
  ASSERT_EQ(first.size(), static_cast<size_t>(kFirst));
  for (size_t i = 0; i < first.size(); ++i) EXPECT_LT(std::fabs(first[i] - ref[i]) / ref[i], 1e-5) << "tp4 step " << i + 1;
  for (const Layout& l : {Layout{.world = 2, .tp = 2}, Layout{}}) {
    run(l, kRest, "", dir, dir + ".resumed", 2);
    const auto got = losses(dir + ".resumed");
    ASSERT_EQ(got.size(), static_cast<size_t>(kRest));
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_LT(std::fabs(got[i] - ref[kFirst + i]) / ref[kFirst + i], 1e-5)
          << "tp4 -> tp" << l.tp << " step " << kFirst + i + 1 << ": " << got[i] << " vs " << ref[kFirst + i];
  }
}

// The vocabulary padding depends on the TP size: 600 tokens are 640 rows at TP 1 and 768 at TP 2
// with --make-vocab-size-divisible-by 128. The true rows reshard and the padding is made afresh
// (zero), in both directions. The padding rows' logits take part in the softmax, so the losses
// cannot match the run that kept its padding; they match a run that re-pads the same way under
// its own TP size (the same 768 or 640 rows through another --make-vocab-size-divisible-by), and
// stay close to the uninterrupted run.
TEST(Reshard, VocabularyPaddedDifferentlyAtTP1AndTP2) {
  const Layout tp1{.vocab = 600, .divisible = 128}, tp2{.world = 2, .tp = 2, .vocab = 600, .divisible = 128};
  auto resume = [](const Layout& l, const std::string& dir, const char* what) {
    run(l, kRest, "", dir, dir + ".resumed");
    auto v = losses(dir + ".resumed");
    EXPECT_EQ(v.size(), static_cast<size_t>(kRest)) << what;
    return v;
  };
  auto expect_same = [](const std::vector<double>& got, const std::vector<double>& want, const char* what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_LT(std::fabs(got[i] - want[i]) / want[i], 1e-5) << what << " step " << i << ": " << got[i] << " vs " << want[i];
  };
  for (const bool up : {true, false}) {  // TP 1 (640 rows) -> TP 2 (768 rows), and back
    const Layout& saver = up ? tp1 : tp2;
    const Layout& loader = up ? tp2 : tp1;
    // The loader's padding under the saver's TP size.
    Layout same_rows = saver;
    same_rows.divisible = up ? 256 : 64;
    const std::string dir = tmp_root() + (up ? "/vocab_up" : "/vocab_down");
    fs::remove_all(dir);
    run(saver, kFirst + kRest, "", "", dir + ".full");
    const auto full = losses(dir + ".full");
    ASSERT_EQ(full.size(), static_cast<size_t>(kFirst + kRest));
    run(saver, kFirst, dir, "", dir + ".first");
    const auto got = resume(loader, dir, up ? "tp1 -> tp2" : "tp2 -> tp1");
    const auto want = resume(same_rows, dir, up ? "tp1 -> tp1 at 768 rows" : "tp2 -> tp2 at 640 rows");
    expect_same(got, want, up ? "tp1 -> tp2" : "tp2 -> tp1");
    for (size_t i = 0; i < got.size(); ++i)  // close to the uninterrupted run: only the padding logits moved
      EXPECT_LT(std::fabs(got[i] - full[kFirst + i]) / full[kFirst + i], 0.05) << "step " << kFirst + i + 1;
  }
}

}  // namespace
}  // namespace mt
