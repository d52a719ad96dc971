// The optimizer's state round-trips through its one interface (optim::Optimizer::state(): the
// tensors checkpoints read and write, on whatever device the optimizer steps): saved to a
// checkpoint, loaded into a fresh model and optimizer, the next step is bit-identical to the
// uninterrupted run's. For the plain optimizer in one process, and for the distributed
// optimizer's shards (parallel::DataParallel's ShardedOptimizer over each DP rank's owned
// slices) in two forked ranks; AdamW and SGD.
#include <gtest/gtest.h>

#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "checkpoint/model_args.h"
#include "comm/local_communicator.h"
#include "comm/multiprocess.h"
#include "core/error.h"
#include "kernels/cpu/threads.h"
#include "kernels/test_util.h"
#include "model/gpt_model.h"
#include "parallel/ddp.h"
#include "support/tiny_models.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

// A tiny Llama laid out by DataParallel over `dp` and the optimizer it makes.
struct Run {
  std::unique_ptr<parallel::DataParallel> dp;
  std::unique_ptr<model::GPTModel> model;
  std::unique_ptr<optim::Optimizer> opt;

  Run(comm::CommPtr dp_comm, bool distributed, const std::string& type) {
    parallel::DDPOptions o;
    o.use_distributed_optimizer = distributed;
    o.bucket_size = 500;  // several buckets: several owned slices per rank
    dp = std::make_unique<parallel::DataParallel>(std::move(dp_comm), o);
    model = std::make_unique<model::GPTModel>(test::tiny_llama_config(2),
                                              model::ModelOptions{nullptr, false, dp->layout_fn()});
    dp->attach(model->params());
    optim::OptimizerConfig oc;
    oc.type = type;
    opt = dp->make_optimizer(oc);
  }
  model::ParamStore& params() { return model->params(); }
  // A step on gradients drawn from `seed` (zero in the buffer's padding, as after a reduction);
  // the distributed optimizer then gathers the other ranks' updated slices, as the trainer does.
  void step(uint64_t seed) {
    for (auto& p : params().params())
      p.grad.copy_from(Tensor::from_vector(test::random_vec<float>(static_cast<size_t>(p.numel()), seed++), p.shape));
    opt->step(params().main_buffer(), params().grad_buffer(), 1e-2, 0.1, {});
    dp->start_param_gather();
  }
};

// Trains two steps, saves to `dir`, loads into a fresh run, and checks that the third step
// gives the same bits in both; throws mt::Error naming what differs (so forked ranks can report).
void round_trip(const std::function<comm::CommPtr()>& dp_comm, const checkpoint::RankInfo& ri, bool distributed,
                const std::string& type, const std::string& dir) {
  Run a(dp_comm(), distributed, type);
  a.step(100);
  a.step(200);
  checkpoint::TrainingState st;
  st.iteration = 2;
  st.optimizer_steps = a.opt->step_count();
  st.args = checkpoint::model_args_to_json(a.model->config(), data::TokenizerOptions{});
  const checkpoint::OptimizerState saved = checkpoint::optimizer_state(*a.opt, a.dp->sharded());
  MT_CHECK(!saved.arrays.empty(), "{}: no optimizer state", type);
  if (a.dp->sharded()) {  // the shard's state covers exactly this rank's owned slices, in order
    const auto owned = a.dp->owned_ranges();
    const size_t per = saved.arrays.size() / owned.size();
    for (size_t i = 0; i < saved.arrays.size(); ++i)
      MT_CHECK(saved.arrays[i].lo == owned[i / per].first && saved.arrays[i].hi == owned[i / per].second,
               "state tensor {} covers [{}, {}), not the owned slice", i, saved.arrays[i].lo, saved.arrays[i].hi);
  }
  checkpoint::Saver(ri).save(dir, st, a.params(), &saved, {});

  Run b(dp_comm(), distributed, type);
  b.params().main_buffer().fill_(0.5f);  // nothing of b's own start survives the load
  checkpoint::OptimizerState into = checkpoint::optimizer_state(*b.opt, b.dp->sharded());
  checkpoint::LoadOptions lo;
  lo.load_rng = false;
  const checkpoint::TrainingState got = checkpoint::load_checkpoint(dir, 2, ri, b.params(), &into, lo);
  b.opt->set_step_count(got.optimizer_steps);
  MT_CHECK(b.opt->step_count() == 2, "loaded step count {}", b.opt->step_count());

  a.step(300);
  b.step(300);
  MT_CHECK(test::bit_equal(a.params().main_buffer().to_vector(), b.params().main_buffer().to_vector()),
           "{}: the step after the load differs from the uninterrupted one", type);
  const auto sa = a.opt->state(), sb = b.opt->state();
  MT_CHECK(sa.size() == sb.size(), "{} vs {} state tensors", sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i)
    MT_CHECK(sa[i].name == sb[i].name && test::bit_equal(sa[i].value.to_vector(), sb[i].value.to_vector()),
             "{}: state tensor {} ({}) differs after the step", type, i, sa[i].name);
}

std::string fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("mt_optimizer_state_" + std::to_string(::getpid())) / name;
  fs::remove_all(dir);
  return dir.string();
}

TEST(OptimizerState, PlainRoundTripsThroughACheckpoint) {
  for (const std::string type : {"adam", "sgd"}) {
    SCOPED_TRACE(type);
    const std::string dir = fresh_dir("plain_" + type);
    EXPECT_NO_THROW(round_trip([] { return std::make_shared<comm::LocalCommunicator>("dp"); }, {}, false, type, dir));
    fs::remove_all(fs::path(dir).parent_path());
  }
}

TEST(OptimizerState, DistributedShardsRoundTripThroughACheckpoint) {
  for (const std::string type : {"adam", "sgd"}) {
    const std::string dir = fresh_dir("sharded_" + type);
    auto res = testing::run_ranks(2, [&](comm::World& w) {
      cpu::set_num_threads(1);  // forked after this process ran OpenMP: one thread (reshard_test.cpp)
      checkpoint::RankInfo ri;
      ri.rank = ri.dp_rank = w.rank();
      ri.world = ri.dp = w.size();
      ri.comm = w.world().get();
      round_trip([&] { return w.world(); }, ri, true, type, dir);
    });
    ASSERT_EQ(res.size(), 2u);
    for (size_t r = 0; r < res.size(); ++r)
      EXPECT_EQ(res[r].exit_code, 0) << type << ", rank " << r << ": " << res[r].stderr_text;
    fs::remove_all(fs::path(dir).parent_path());
  }
}

}  // namespace
}  // namespace mt
