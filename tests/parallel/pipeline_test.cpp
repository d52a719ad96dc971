// Pipeline parallelism trains the same model to the same losses as one rank: for 20 steps the
// loss matches the single-rank run (fp32: 1e-5 relative) and, after the first step, every
// gradient element a rank holds matches the single-rank gradient of the parameter with the same
// name (layers keep their global index; TP shards are cut from the reference; with the
// distributed optimizer only owned slices are compared). Also: 1F1B keeps at most PP - stage
// micro-batches of activations, a failing stage makes every rank exit with an error, and the log
// line comes once, from the last stage, with the global loss. Ranks are forked processes over
// Gloo; the reference runs in a forked child too (no OpenMP in this process before forking).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "comm/multiprocess.h"
#include "comm/socket.h"
#include "parallel/layout_support.h"
#include "core/log.h"
#include "parallel/process_groups.h"
#include "training/trainer.h"

namespace mt {
namespace {

constexpr int kSteps = 20;
constexpr int32_t kVocab = 64;

class PatternSource : public data::SampleSource {
 public:
  // `fail_rank`/`fail_at`: that world rank throws when it reads sample `fail_at` (a failing stage).
  PatternSource(int64_t n, int64_t S, int fail_rank = -1, int64_t fail_at = 0)
      : n_(n), S_(S), fail_rank_(fail_rank), fail_at_(fail_at) {}
  int64_t size() const override { return n_; }
  int64_t seq_length() const override { return S_; }
  void get(int64_t index, int32_t* t) const override {
    if (fail_rank_ >= 0 && index >= fail_at_ && std::atoi(std::getenv("RANK")) == fail_rank_)
      throw Error("injected failure reading sample " + std::to_string(index));
    for (int64_t i = 0; i <= S_; ++i)
      t[i] = static_cast<int32_t>((index * 7 + i * 3 + (i % 4 == 0 ? index * index : 0)) % (kVocab - 3));
  }

 private:
  int64_t n_, S_;
  int fail_rank_;
  int64_t fail_at_;
};

enum class Shape { Llama, Gpt };  // Llama: untied head, RMSNorm, RoPE; GPT: tied embeddings, LayerNorm, biases

struct Layout {
  Shape shape = Shape::Llama;
  int world = 1, tp = 1, pp = 1;
  int64_t vpp = 0;              // --num-virtual-stages-per-pipeline-rank
  int64_t first = 0, last = 0;  // --decoder-first/last-pipeline-num-layers
  bool sp = false, dist_opt = false, overlap_grad = false;
  int64_t bucket = 0;
  int64_t mbs = 2;  // the global batch is 8 whatever the layout
};

Arguments make_args(const Layout& l) {
  Arguments a;
  auto& m = a.model;
  testing::set_layout_model(a, 4);
  if (l.shape == Shape::Llama) {
    testing::set_query_groups(a, 4);
    test::use_llama_blocks(m);
  }
  testing::set_short_run(a, kSteps, l.mbs, 3e-3f, 3e-4);
  a.world_size = l.world;
  a.tensor_model_parallel_size = l.tp;
  a.pipeline_model_parallel_size = l.pp;
  a.num_virtual_stages_per_pipeline_rank = l.vpp;
  a.decoder_first_pipeline_num_layers = l.first;
  a.decoder_last_pipeline_num_layers = l.last;
  a.sequence_parallel = l.sp;
  a.use_distributed_optimizer = l.dist_opt;
  a.overlap_grad_reduce = l.overlap_grad;
  a.ddp_bucket_size = l.bucket;
  validate_args(a, kVocab);
  return a;
}

const std::string& tmp_dir() { return testing::scratch_dir("mt_pipeline"); }

parallel::ProcessGroups groups_for(comm::World& w, const Layout& l) {
  parallel::RankGrid grid(w.size(), l.tp, l.pp);
  return w.size() > 1 ? parallel::build_process_groups(w, grid) : parallel::local_process_groups();
}

// Every gradient element this rank holds (and owns, under the distributed optimizer) against the
// reference's element at the same position of the same-named parameter.
void train_rank(comm::World& w, const Layout& l, const std::string& out, const std::string& ref) {
  Arguments a = make_args(l);
  Trainer t(a, nullptr, groups_for(w, l));
  t.set_data(std::make_unique<PatternSource>(100000, a.model.seq_length), nullptr);
  const int stage = t.groups().pp->rank();
  const int64_t M = a.global_batch_size / (a.micro_batch_size * a.data_parallel_size);
  // 1F1B: stage s keeps at most PP - s micro-batches of activations.
  const auto check_in_flight = [&](int) {
    if (a.virtual_pipeline_model_parallel_size == 1 &&
        t.pipeline().max_in_flight() > std::min<int64_t>(l.pp - stage, M))
      throw Error(fmt::format("stage {} held {} micro-batches at once", stage, t.pipeline().max_in_flight()));
  };
  const std::vector<double> losses =
      testing::train_checking_step1(t, kSteps, w.rank(), out, ref, 2e-6, check_in_flight);
  // The loss is global on every rank; rank 0 (first stage) writes it.
  if (w.rank() == 0) testing::write_losses(out + ".loss", losses);
}


void expect_same_as_single_rank(const Layout& l) {
  auto train = [](const Layout& layout) {
    return [layout](comm::World& w, const std::string& out, const std::string& ref) { train_rank(w, layout, out, ref); };
  };
  const std::string& ref = testing::reference_run(tmp_dir() + (l.shape == Shape::Llama ? "/ref_llama" : "/ref_gpt"),
                                                  train({.shape = l.shape}));
  double worst = 0;
  ASSERT_NO_FATAL_FAILURE(testing::expect_layout_matches(ref, tmp_dir() + "/run", l.world, kSteps, train(l), worst));
  std::printf(
      "[ layout ] %s world %d tp %d pp %d vpp %ld first %ld last %ld%s%s: max relative loss difference over "
      "%d steps %.2e\n",
      l.shape == Shape::Llama ? "llama" : "gpt", l.world, l.tp, l.pp, static_cast<long>(l.vpp),
      static_cast<long>(l.first), static_cast<long>(l.last), l.sp ? " sp" : "", l.dist_opt ? " dist-opt" : "", kSteps,
      worst);
}

TEST(Pipeline, PP2) { expect_same_as_single_rank({.world = 2, .pp = 2}); }
TEST(Pipeline, PP4TiedEmbeddings) { expect_same_as_single_rank({.shape = Shape::Gpt, .world = 4, .pp = 4}); }
TEST(Pipeline, PP2TwoVirtualStages) { expect_same_as_single_rank({.world = 2, .pp = 2, .vpp = 2}); }
TEST(Pipeline, PP3UnevenStages) { expect_same_as_single_rank({.world = 3, .pp = 3, .first = 1, .last = 1}); }
TEST(Pipeline, PP2xTP2SequenceParallel) { expect_same_as_single_rank({.world = 4, .tp = 2, .pp = 2, .sp = true}); }
TEST(Pipeline, PP2xDP2DistributedOptimizerTied) {
  expect_same_as_single_rank(
      {.shape = Shape::Gpt, .world = 4, .pp = 2, .dist_opt = true, .overlap_grad = true, .bucket = 3000});
}
TEST(Pipeline, PP2TiedEmbeddings) { expect_same_as_single_rank({.shape = Shape::Gpt, .world = 2, .pp = 2}); }

TEST(Pipeline, FailingStageStopsEveryRank) {
  Layout l{.world = 2, .pp = 2};
  testing::RankOptions o;
  o.env = {{"OMP_NUM_THREADS", "1"}};
  o.comm_timeout = std::chrono::milliseconds(20000);
  o.deadline = std::chrono::seconds(60);
  // The last stage fails while reading the third global batch; the first stage is then waiting
  // for its gradients.
  auto res = testing::run_ranks(
      2,
      [&](comm::World& w) {
        Arguments a = make_args(l);
        Trainer t(a, nullptr, groups_for(w, l));
        t.set_data(std::make_unique<PatternSource>(100000, a.model.seq_length, 1, 16), nullptr);
        for (int i = 0; i < 5; ++i) t.train_step();
      },
      o);
  ASSERT_EQ(res.size(), 2u);
  EXPECT_EQ(res[1].exit_code, 2) << res[1].stderr_text;
  EXPECT_NE(res[1].stderr_text.find("injected failure"), std::string::npos) << res[1].stderr_text;
  EXPECT_EQ(res[0].exit_code, 2) << res[0].stderr_text;
  EXPECT_NE(res[0].stderr_text.find("world rank 1"), std::string::npos) << res[0].stderr_text;  // names the peer
  EXPECT_LT(res[0].seconds, 20.0);  // well inside the timeout
}

// Trainer::run with PP = 2: the iteration and validation lines come only from the last stage,
// with the loss of the single-rank run.
std::string run_and_capture(const Layout& l, int rank_to_read) {
  const std::string dir = tmp_dir();
  auto res = testing::run_ranks(l.world, [&](comm::World& w) {
    std::fflush(stdout);
    if (!std::freopen((dir + "/log" + std::to_string(w.rank())).c_str(), "w", stdout)) throw Error("freopen");
    set_log_rank(w.rank());
    Arguments a = make_args(l);
    a.train_iters = 4;
    a.log_interval = 1;
    a.eval_iters = 1;
    a.eval_interval = 2;
    Trainer t(a, nullptr, groups_for(w, l));
    t.set_data(std::make_unique<PatternSource>(100000, a.model.seq_length),
               std::make_unique<PatternSource>(1000, a.model.seq_length));
    t.run();
    std::fflush(stdout);
  });
  for (auto& r : res) EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
  std::ifstream f(dir + "/log" + std::to_string(rank_to_read));
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::vector<double> values_after(const std::string& text, const std::string& key) {
  std::vector<double> v;
  for (size_t p = text.find(key); p != std::string::npos; p = text.find(key, p + 1))
    v.push_back(std::strtod(text.c_str() + p + key.size(), nullptr));
  return v;
}

TEST(Pipeline, LogLineComesFromTheLastStageWithTheGlobalLoss) {
  const std::string single = run_and_capture({}, 0);
  const std::string first = run_and_capture({.world = 2, .pp = 2}, 0);
  const std::string last = run_and_capture({.world = 2, .pp = 2}, 1);
  EXPECT_EQ(first.find("lm loss"), std::string::npos) << first;  // the first stage prints neither line
  for (const char* key : {"| lm loss: ", "lm loss value: "}) {
    auto want = values_after(single, key), got = values_after(last, key);
    ASSERT_EQ(got.size(), want.size()) << key << "\n" << last;
    ASSERT_FALSE(want.empty()) << single;
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * want[i]) << key << i;
  }
  EXPECT_EQ(values_after(last, "| lm loss: ").size(), 4u);
}

TEST(Pipeline, CommandLineRunWithLauncher) {
  int port = 0;
  ::close(comm::listen_on("127.0.0.1", 0, &port));
  const std::string out = tmp_dir() + "/cli.log";
  const std::string cmd =
      std::string(MT_BINARY_DIR) + "/bin/megatron launch --nproc-per-node 2 --master-port " + std::to_string(port) +
      " -- pretrain --mock-data --vocab-size 60 --num-layers 4 --hidden-size 16 --num-attention-heads 2 "
      "--seq-length 8 --micro-batch-size 1 --global-batch-size 4 --train-iters 3 --lr 1e-3 --log-interval 1 "
      "--eval-iters 0 --make-vocab-size-divisible-by 16 --no-progress-bar --distributed-timeout-minutes 1 "
      "--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 > " +
      out + " 2>&1";
  const int rc = std::system(("OMP_NUM_THREADS=1 " + cmd).c_str());
  std::ifstream f(out);
  std::stringstream s;
  s << f.rdbuf();
  const std::string text = s.str();
  EXPECT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("pipeline-parallel 2 (2 virtual stages per rank"), std::string::npos) << text;
  EXPECT_EQ(values_after(text, "| lm loss: ").size(), 3u) << text;  // printed once per iteration
}

}  // namespace
}  // namespace mt
