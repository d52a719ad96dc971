#pragma once
// What the "same as one rank" tests of tests/parallel share: a deterministic token source, a
// per-process scratch directory, step-1 gradients written by name and compared shard by shard
// (TP shards cut from the reference with the parameter's own split; with the distributed
// optimizer only the owned slices), and the per-step losses written and compared.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "comm/multiprocess.h"
#include "core/error.h"
#include "data/sample_source.h"
#include "model/gpt_model.h"
#include "model/params.h"
#include "support/tiny_models.h"
#include "training/arguments.h"
#include "training/trainer.h"

namespace mt::testing {

// Sequences with some structure to learn, the same for every layout.
class PatternSource : public data::SampleSource {
 public:
  PatternSource(int64_t n, int64_t S, int32_t vocab) : n_(n), S_(S), vocab_(vocab) {}
  int64_t size() const override { return n_; }
  int64_t seq_length() const override { return S_; }
  void get(int64_t index, int32_t* t) const override {
    for (int64_t i = 0; i <= S_; ++i)
      t[i] = static_cast<int32_t>((index * 7 + i * 3 + (i % 4 == 0 ? index * index : 0)) % (vocab_ - 3));
  }

 private:
  int64_t n_, S_;
  int32_t vocab_;
};

// Grouped-query attention with `groups` query groups, as the flag would set it.
inline void set_query_groups(Arguments& a, int64_t groups) {
  a.group_query_attention = true;
  a.given = {"--num-query-groups"};
  a.model.num_query_groups = groups;
}

// The layout tests' model: `layers` layers 32 wide with 8 heads, 16 tokens, ffn 64, no dropout.
inline void set_layout_model(Arguments& a, int64_t layers) {
  auto& m = a.model;
  m.num_layers = layers;
  m.hidden_size = 32;
  m.num_attention_heads = 8;
  m.seq_length = 16;
  m.ffn_hidden_size = 64;
  m.attention_dropout = 0.f;
  m.hidden_dropout = 0.f;
}

// What every layout test trains: mock data, a global batch of 8 in micro-batches of `mbs`,
// `steps` iterations with 2 of warm-up and cosine decay from `lr` to `min_lr`, no evaluation.
inline void set_short_run(Arguments& a, int64_t steps, int64_t mbs, float lr, double min_lr) {
  a.make_vocab_size_divisible_by = 16;
  a.data.mock = true;
  a.micro_batch_size = mbs;
  a.global_batch_size = 8;
  a.train_iters = steps;
  a.optimizer.lr = lr;
  a.lr_warmup_iters = 2;
  a.lr_decay_style = "cosine";
  a.min_lr = min_lr;
  a.eval_iters = 0;
  a.log_progress_bar = false;
}

// /tmp/<prefix>_<pid>, made once per process.
inline const std::string& scratch_dir(const std::string& prefix) {
  static std::map<std::string, std::string> dirs;
  auto it = dirs.find(prefix);
  if (it != dirs.end()) return it->second;
  std::string p = "/tmp/" + prefix + "_" + std::to_string(::getpid());
  if (std::system(("mkdir -p " + p).c_str()) != 0) throw Error("mkdir " + p);
  return dirs[prefix] = p;
}

// A parameter's gradient as host floats (it may live on the GPU).
inline std::vector<float> host_grad(const model::Param& p) {
  Tensor h = p.grad.device() == Device::CPU ? p.grad : p.grad.to_device(Device::CPU);
  return std::vector<float>(h.data<float>(), h.data<float>() + p.numel());
}

using GradMap = std::map<std::string, std::vector<float>>;

inline void write_grads(const std::string& path, const model::ParamStore& ps) {
  std::ofstream f(path, std::ios::binary);
  for (const auto& p : ps.params()) {
    const std::vector<float> g = host_grad(p);
    const uint64_t len = p.name.size(), n = g.size();
    f.write(reinterpret_cast<const char*>(&len), 8);
    f.write(p.name.data(), static_cast<std::streamsize>(len));
    f.write(reinterpret_cast<const char*>(&n), 8);
    f.write(reinterpret_cast<const char*>(g.data()), static_cast<std::streamsize>(n * 4));
  }
}

inline GradMap read_grads(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  GradMap out;
  for (uint64_t len = 0; f.read(reinterpret_cast<char*>(&len), 8);) {
    std::string name(len, '\0');
    uint64_t n = 0;
    f.read(name.data(), static_cast<std::streamsize>(len));
    f.read(reinterpret_cast<char*>(&n), 8);
    std::vector<float> g(n);
    f.read(reinterpret_cast<char*>(g.data()), static_cast<std::streamsize>(n * 4));
    out[name] = std::move(g);
  }
  return out;
}

struct GradDiff {
  double max_err = 0, max_ref = 0;
  std::string worst;
  int tensors = 0;
};

// Every gradient element this rank holds and owns against the reference's element at the same
// position of the same-named full parameter (a tied embedding's copy on the last pipeline stage
// carries its twin's name and gradient).
inline GradDiff diff_grads(const model::ParamStore& ps, const GradMap& ref,
                           const std::vector<std::pair<int64_t, int64_t>>& owned) {
  GradDiff d;
  for (const auto& p : ps.params()) {
    auto it = ref.find(p.name);
    if (it == ref.end()) throw Error(p.name + " is not a parameter of the single-rank model");
    std::vector<float> want(static_cast<size_t>(p.numel()));
    model::extract_shard(p, it->second.data(), want.data());
    const std::vector<float> g = host_grad(p);
    for (int64_t e = 0; e < p.numel(); ++e) {
      const int64_t flat = p.offset + e;
      if (!std::any_of(owned.begin(), owned.end(), [&](auto r) { return flat >= r.first && flat < r.second; }))
        continue;
      const double w = want[static_cast<size_t>(e)], err = std::fabs(static_cast<double>(g[static_cast<size_t>(e)]) - w);
      d.max_ref = std::max(d.max_ref, std::fabs(w));
      if (err > d.max_err) {
        d.max_err = err;
        d.worst = p.name;
      }
    }
    ++d.tensors;
  }
  return d;
}

// Fails the rank when the gradients differ by more than `rel` of the largest one (fp32 sums in
// another order: 2e-6).
inline void require_close(const GradDiff& d, int rank, double rel = 2e-6) {
  if (d.tensors == 0 || d.max_err > rel * d.max_ref + 1e-9)
    throw Error(fmt::format("rank {}: step-1 gradient differs by {} (largest gradient {}) in {}", rank, d.max_err,
                            d.max_ref, d.worst));
}

// Trains `steps` steps on this rank and returns the per-step losses. After step 1 the reference
// run (ref empty) writes its full gradients by name to out.grads; any other layout compares its
// own shards with them (require_close with `rel`). `after_step(i)` adds per-step checks;
// `grad_norms` (if given) gets each step's global grad norm.
inline std::vector<double> train_checking_step1(Trainer& t, int steps, int rank, const std::string& out,
                                                const std::string& ref, double rel = 2e-6,
                                                const std::function<void(int)>& after_step = {},
                                                std::vector<double>* grad_norms = nullptr) {
  std::vector<double> losses;
  for (int i = 0; i < steps; ++i) {
    const auto r = t.train_step();
    losses.push_back(r.loss_sum / r.tokens);
    if (grad_norms) grad_norms->push_back(r.grad_norm);
    if (after_step) after_step(i);
    if (i != 0) continue;
    if (ref.empty()) {
      write_grads(out + ".grads", t.model().params());
      continue;
    }
    const GradDiff d = diff_grads(t.model().params(), read_grads(ref + ".grads"), t.data_parallel().owned_ranges());
    std::fprintf(stderr, "rank %d: step-1 gradients: max difference %.3e, largest gradient %.3e (%d tensors)\n", rank,
                 d.max_err, d.max_ref, d.tensors);
    require_close(d, rank, rel);
  }
  return losses;
}

inline void write_losses(const std::string& path, const std::vector<double>& losses) {
  std::ofstream f(path);
  f.precision(17);
  for (double x : losses) f << x << "\n";
}

inline std::vector<double> read_losses(const std::string& path) {
  std::ifstream f(path);
  std::vector<double> v;
  for (double x; f >> x;) v.push_back(x);
  return v;
}

// Every rank of a layout run exited cleanly (a failing rank's stderr in the message).
inline void expect_ranks_ok(const std::vector<RankResult>& res, int world) {
  ASSERT_EQ(res.size(), static_cast<size_t>(world));
  for (size_t r = 0; r < res.size(); ++r) ASSERT_EQ(res[r].exit_code, 0) << "rank " << r << ": " << res[r].stderr_text;
}

// The per-step losses of a layout run (`out`.loss) against the reference run's (`ref`.loss):
// `steps` of them, each within `tol` relative (a failure names the step), and the reference
// trains (its last loss below its first by more than `margin`). `worst` gets the largest
// relative difference, `want` the reference losses.
inline void expect_losses_match(const std::string& ref, const std::string& out, size_t steps, double tol,
                                double margin, const char* against, double& worst, std::vector<double>& want) {
  want = read_losses(ref + ".loss");
  const std::vector<double> got = read_losses(out + ".loss");
  worst = 0;
  ASSERT_EQ(want.size(), steps);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const double rel = std::fabs(got[i] - want[i]) / std::fabs(want[i]);
    worst = std::max(worst, rel);
    EXPECT_LT(rel, tol) << "step " << i + 1 << ": " << got[i] << " vs " << against << " " << want[i];
  }
  EXPECT_LT(want.back(), want.front() - margin);  // it trains
}

// What a layout test runs on each rank: train, writing to `out` (rank 0: out.loss), comparing
// step-1 gradients with the reference at `ref` (empty: this is the reference).
using LayoutRun = std::function<void(comm::World& w, const std::string& out, const std::string& ref)>;

// The single-rank reference run writing to `out`, made once per path (in a forked child).
inline const std::string& reference_run(const std::string& out, const LayoutRun& train) {
  static std::map<std::string, std::string> made;
  auto it = made.find(out);
  if (it != made.end()) return it->second;
  auto res = run_ranks(1, [&](comm::World& w) { train(w, out, ""); });
  if (res.size() != 1 || res[0].exit_code != 0)
    throw Error("reference run failed: " + (res.empty() ? std::string() : res[0].stderr_text));
  return made[out] = out;
}

// A layout of `world` forked ranks (one OpenMP thread each) trains `steps` steps into `out`;
// every rank must exit cleanly and the losses match the reference's (1e-5 relative). `worst`
// gets the largest relative difference.
inline void expect_layout_matches(const std::string& ref, const std::string& out, int world, size_t steps,
                                  const LayoutRun& train, double& worst) {
  std::remove((out + ".loss").c_str());
  RankOptions o;
  o.env = {{"OMP_NUM_THREADS", "1"}};
  auto res = run_ranks(world, [&](comm::World& w) { train(w, out, ref); }, o);
  ASSERT_NO_FATAL_FAILURE(expect_ranks_ok(res, world));
  std::vector<double> want;
  ASSERT_NO_FATAL_FAILURE(expect_losses_match(ref, out, steps, 1e-5, 0.0, "single rank", worst, want));
}

// A 3-layer Llama-style model with dropout on (both streams drawn) and the given recomputation,
// for bit-identity checks under TP. `heads` over 2 query groups.
inline model::TransformerConfig recompute_tp_config(int64_t heads, bool qk_layernorm, const std::string& granularity,
                                                    const std::string& method, int64_t n) {
  model::TransformerConfig c;
  c.num_layers = 3;
  c.hidden_size = 32;
  c.num_attention_heads = heads;
  c.num_query_groups = 2;
  c.ffn_hidden_size = 64;
  c.seq_length = 8;
  c.vocab_size = 64;
  c.orig_vocab_size = 60;
  test::use_llama_blocks(c);
  c.qk_layernorm = qk_layernorm;
  c.attention_dropout = 0.2f;
  c.hidden_dropout = 0.2f;
  c.recompute_granularity = granularity;
  c.recompute_method = method;
  c.recompute_num_layers = n;
  c.finalize();
  return c;
}

// One step of two micro-batches (F0 F1 B1 B0) of a model on this rank's TP group with sequence
// parallelism (unless !sp) and both dropout streams: this rank's gradients (for bit-identity
// checks). `saved_bytes` (if given) gets layer 0's saved activation bytes of micro-batch 0.
inline std::vector<float> two_microbatch_grads(const model::TransformerConfig& c, comm::Communicator* tp,
                                               bool sp = true, size_t* saved_bytes = nullptr) {
  model::ModelOptions o;
  o.tp = tp;
  o.sequence_parallel = sp;
  model::GPTModel m(c, o);
  RngState rng{11, 0}, tp_rng{100 + static_cast<uint64_t>(tp->rank()), 0};
  model::PassContext ctx;
  ctx.rng = &rng;
  ctx.tp_rng = &tp_rng;
  model::Batch b[2];
  for (int k = 0; k < 2; ++k) {
    b[k].B = 2;
    b[k].S = c.seq_length;
    for (int64_t i = 0; i < b[k].B * b[k].S; ++i) {
      b[k].tokens.push_back(static_cast<int32_t>((i * 7 + k * 13) % c.orig_vocab_size));
      b[k].labels.push_back(static_cast<int32_t>((i * 5 + k * 3 + 1) % c.orig_vocab_size));
      b[k].loss_mask.push_back(1.f);
    }
  }
  model::GPTModel::Saved s0, s1;
  const model::LossSums l0 = m.forward(b[0], s0, ctx), l1 = m.forward(b[1], s1, ctx);
  if (saved_bytes) *saved_bytes = model::TransformerLayer::saved_bytes(s0.layers[0]);
  const float scale = static_cast<float>(1.0 / (l0.tokens + l1.tokens));
  m.params().zero_grad();
  m.backward(s1, scale, ctx);
  m.backward(s0, scale, ctx);
  return m.params().grad_buffer().to_vector();
}

}  // namespace mt::testing
