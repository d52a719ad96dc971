// GPU side of tensor parallelism in the model: the vocab-parallel embedding and cross-entropy
// kernels for two fake TP ranks (their partial statistics combined by hand, as the all-reduces
// would) against the CPU full-vocabulary reference, the same ops through model/vocab_parallel
// with a group of one, bf16 TP collectives' dtype checks, and GPTModel's device-side loss sum
// against the host sum of the same logits and against the CPU model, with the head's loss
// gradient formed in the backward or (fused cross-entropy) in the forward.
#ifdef MT_HAVE_CUDA

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "comm/local_communicator.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/vocab_parallel.h"
#include "model/gpt_model.h"
#include "model/recording_comm.h"
#include "model/vocab_parallel.h"
#include "support/gpu.h"

namespace mt::model {
namespace {

bool gpu_ready() {
  if (!test::have_gpu()) return false;
  test::gpu();
  return true;
}
#define MT_REQUIRE_GPU() \
  if (!gpu_ready()) GTEST_SKIP() << "no CUDA device visible"

// Random values already on the bf16 grid, so CPU and GPU see the same inputs.
std::vector<float> bf16_values(size_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = round_bf16(d(g));
  return v;
}
std::vector<int32_t> random_ids(size_t n, uint64_t seed, int32_t V) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = static_cast<int32_t>(g() % static_cast<uint64_t>(V));
  return v;
}

Tensor gpu_bf16(const std::vector<float>& v, const Shape& s) {
  return Tensor::from_vector(v, s).to(DType::BF16).to_device(Device::CUDA);
}
Tensor gpu_f32(const std::vector<float>& v, const Shape& s) { return Tensor::from_vector(v, s).to_device(Device::CUDA); }
Tensor gpu_i32(const std::vector<int32_t>& v) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}).to_device(Device::CUDA);
}
std::vector<float> host(const Tensor& t) { return t.to_device(Device::CPU).to_vector(); }

// Columns [c0, c0 + w) of a row-major [rows, cols] matrix.
std::vector<float> columns(const std::vector<float>& m, int64_t rows, int64_t cols, int64_t c0, int64_t w) {
  std::vector<float> out(static_cast<size_t>(rows * w));
  for (int64_t r = 0; r < rows; ++r)
    std::copy_n(m.begin() + r * cols + c0, w, out.begin() + r * w);
  return out;
}

// |got - want| <= atol + rtol * |want| everywhere; reports the first few misses.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, double atol, double rtol,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = atol + rtol * std::fabs(want[i]);
    if (!(std::fabs(static_cast<double>(got[i]) - want[i]) <= tol) && ++bad <= 5)
      ADD_FAILURE() << what << "[" << i << "]: " << got[i] << " vs " << want[i];
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " out of tolerance";
}

constexpr int64_t kV = 1000, kTP = 2, kVl = kV / kTP;

// Labels that hit both ends of both ranks' ranges, then random ones.
std::vector<int32_t> test_labels(int64_t n) {
  std::vector<int32_t> l = random_ids(static_cast<size_t>(n), 11, static_cast<int32_t>(kV));
  const int32_t edges[] = {0, kVl - 1, kVl, kV - 1};
  for (size_t i = 0; i < 4; ++i) l[i] = edges[i];
  return l;
}

TEST(GpuVocabParallel, CrossEntropyOfTwoRanksMatchesCpuFullVocab) {
  MT_REQUIRE_GPU();
  const int64_t n = 37;
  std::vector<float> logits = bf16_values(static_cast<size_t>(n * kV), 1, -4.f, 4.f);
  logits[0 * kV + 777] = 12.f;  // a row whose maximum is on rank 1, one on rank 0
  logits[1 * kV + 3] = 12.f;
  const std::vector<int32_t> labels = test_labels(n);
  std::vector<float> dloss = bf16_values(static_cast<size_t>(n), 3, 0.f, 2.f);
  dloss[5] = 0.f;  // a masked token

  std::vector<float> loss_ref(n), lse_ref(n), dlogits_ref(static_cast<size_t>(n * kV));
  cpu::cross_entropy_forward(logits.data(), labels.data(), loss_ref.data(), lse_ref.data(), n, kV, kV);
  cpu::cross_entropy_backward(logits.data(), labels.data(), lse_ref.data(), dloss.data(), dlogits_ref.data(), n, kV,
                              kV);

  Tensor lab = gpu_i32(labels);
  Tensor part[kTP];
  for (int64_t r = 0; r < kTP; ++r) part[r] = gpu_bf16(columns(logits, n, kV, r * kVl, kVl), {n, kVl});

  // All-reduce Max of the per-rank row maxima, by hand.
  std::vector<float> mx(static_cast<size_t>(n), -INFINITY);
  for (int64_t r = 0; r < kTP; ++r) {
    const auto m = host(ops::gpu::vocab_ce_row_max(part[r]));
    for (int64_t i = 0; i < n; ++i) mx[i] = std::max(mx[i], m[i]);
  }
  for (int64_t i = 0; i < n; ++i)
    EXPECT_EQ(mx[i], *std::max_element(logits.begin() + i * kV, logits.begin() + (i + 1) * kV)) << "row " << i;
  Tensor gmx = gpu_f32(mx, {n});

  // All-reduce Sum of (sum exp, target logit); the target logit comes from its owner only.
  std::vector<float> stats(static_cast<size_t>(2 * n), 0.f);
  for (int64_t r = 0; r < kTP; ++r) {
    const auto st = host(ops::gpu::vocab_ce_partial_stats(part[r], lab, gmx, r * kVl));
    for (int64_t i = 0; i < n; ++i) {
      const bool owner = labels[i] / kVl == r;
      EXPECT_EQ(st[2 * i + 1], owner ? logits[i * kV + labels[i]] : 0.f) << "rank " << r << " row " << i;
      EXPECT_GT(st[2 * i], 0.f);
    }
    for (size_t k = 0; k < stats.size(); ++k) stats[k] += st[k];
  }
  Tensor losses, lse;
  ops::gpu::vocab_ce_finish(gmx, gpu_f32(stats, {n, 2}), losses, lse);
  expect_close(host(losses), loss_ref, 1e-5, 1e-5, "losses");
  expect_close(host(lse), lse_ref, 1e-5, 1e-5, "lse");

  // Backward per rank over its own columns: bf16 output, so bf16 tolerance.
  Tensor gdl = gpu_f32(dloss, {n});
  for (int64_t r = 0; r < kTP; ++r) {
    Tensor d = ops::vocab_cross_entropy_backward(part[r], lab, lse, gdl, r * kVl);
    EXPECT_EQ(d.dtype(), DType::BF16);
    expect_close(host(d), columns(dlogits_ref, n, kV, r * kVl, kVl), 1e-6, 1e-2, "dlogits");
  }
}

TEST(GpuVocabParallel, CrossEntropyThroughModelApiWithGroupOfOne) {
  MT_REQUIRE_GPU();
  const int64_t n = 19, V = 256;
  const std::vector<float> logits = bf16_values(static_cast<size_t>(n * V), 4, -3.f, 3.f);
  const std::vector<int32_t> labels = random_ids(static_cast<size_t>(n), 5, static_cast<int32_t>(V));
  const std::vector<float> dloss = bf16_values(static_cast<size_t>(n), 6, 0.f, 1.f);
  std::vector<float> loss_ref(n), lse_ref(n), d_ref(static_cast<size_t>(n * V));
  cpu::cross_entropy_forward(logits.data(), labels.data(), loss_ref.data(), lse_ref.data(), n, V, V);
  cpu::cross_entropy_backward(logits.data(), labels.data(), lse_ref.data(), dloss.data(), d_ref.data(), n, V, V);

  comm::LocalCommunicator one("tp");
  for (comm::Communicator* c : {static_cast<comm::Communicator*>(nullptr), static_cast<comm::Communicator*>(&one)}) {
    TensorParallel tp;
    tp.comm = c;
    Tensor lab = gpu_i32(labels), losses, lse;
    vocab_parallel_cross_entropy_forward(gpu_bf16(logits, {n, V}), lab, tp, losses, lse);
    expect_close(host(losses), loss_ref, 1e-5, 1e-5, "losses");
    Tensor d = vocab_parallel_cross_entropy_backward(gpu_bf16(logits, {n, V}), lab, lse, gpu_f32(dloss, {n}), tp);
    expect_close(host(d), d_ref, 1e-6, 1e-2, "dlogits");
  }
}

void check_embedding(int64_t h) {
  const int64_t n = 53;
  const std::vector<float> table = bf16_values(static_cast<size_t>(kV * h), 21, -1.f, 1.f);
  std::vector<int32_t> ids = random_ids(static_cast<size_t>(n), 22, static_cast<int32_t>(kV));
  for (int64_t i = 0; i < n; i += 7) ids[i] = kVl;  // a repeated id at the start of rank 1
  ids[1] = kVl - 1, ids[2] = 0, ids[3] = kV - 1, ids[4] = kVl - 1;
  const std::vector<float> dout = bf16_values(static_cast<size_t>(n * h), 23, -1.f, 1.f);
  const std::vector<float> grad0 = bf16_values(static_cast<size_t>(kV * h), 24, -1.f, 1.f);  // += into this
  std::vector<float> grad_ref = grad0;
  cpu::embedding_backward(ids.data(), dout.data(), grad_ref.data(), n, h);

  Tensor gids = gpu_i32(ids);
  std::vector<float> sum(static_cast<size_t>(n * h), 0.f);
  for (int64_t r = 0; r < kTP; ++r) {
    const auto rows = [&](const std::vector<float>& m) {
      return std::vector<float>(m.begin() + r * kVl * h, m.begin() + (r + 1) * kVl * h);
    };
    const auto out = host(ops::vocab_embedding_forward(gids, gpu_bf16(rows(table), {kVl, h}), r * kVl));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < h; ++c) {
        const float v = out[i * h + c];
        if (ids[i] / kVl != r) {
          EXPECT_EQ(v, 0.f) << "rank " << r << " row " << i << " not owned";
        }
        sum[i * h + c] += v;
      }
    // Backward into a non-zero gradient, twice from the same start: deterministic bits.
    std::vector<uint8_t> first;
    for (int rep = 0; rep < 2; ++rep) {
      Tensor g = gpu_f32(rows(grad0), {kVl, h});
      ops::vocab_embedding_backward(gids, gpu_bf16(dout, {n, h}), g, r * kVl);
      Tensor gh = g.to_device(Device::CPU);
      std::vector<uint8_t> bytes(gh.nbytes());
      std::memcpy(bytes.data(), gh.raw(), bytes.size());
      if (rep == 0) {
        expect_close(gh.to_vector(), rows(grad_ref), 1e-5, 1e-5, "dtable");
        first = bytes;
      } else {
        EXPECT_EQ(bytes, first) << "embedding backward is not deterministic";
      }
    }
  }
  // The TP sum of the partial rows is the full lookup, exactly (one non-zero term per row).
  std::vector<float> want(static_cast<size_t>(n * h));
  cpu::embedding_forward(ids.data(), table.data(), want.data(), n, h);
  EXPECT_EQ(sum, want);

  // The model-level entry with a group of one covers the whole table.
  TensorParallel tp;
  expect_close(host(vocab_parallel_embedding_forward(gids, gpu_bf16(table, {kV, h}), tp)), want, 0, 0, "full lookup");
}

TEST(GpuVocabParallel, EmbeddingOfTwoRanksMatchesCpu) {
  MT_REQUIRE_GPU();
  check_embedding(64);  // 16-byte vector path
  check_embedding(40);  // scalar path (40 bf16 = 80 bytes per row)
}

using mt::testing::RecordingComm;

TEST(GpuTensorParallel, CollectivesSendBf16DeviceTensorsAsBf16) {
  MT_REQUIRE_GPU();
  RecordingComm rec;
  TensorParallel tp;
  tp.comm = &rec;
  tp.sequence_parallel = true;
  Tensor g = gpu_bf16(std::vector<float>(24, 1.f), {4, 6});
  all_reduce_tp(g, tp);
  Tensor full = all_gather_rows(g, tp);
  Tensor shard = reduce_scatter_rows(g, tp);
  EXPECT_EQ(full.shape(), (Shape{8, 6}));
  EXPECT_EQ(shard.shape(), (Shape{2, 6}));
  EXPECT_EQ(full.dtype(), DType::BF16);
  EXPECT_EQ(full.device(), Device::CUDA);
  ASSERT_EQ(rec.calls.size(), 3u);
  const size_t counts[] = {24, 24, 12};  // all-reduce: all; all-gather: the shard; reduce-scatter: the output
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(rec.calls[i].type, comm::DataType::BF16) << i;
    EXPECT_EQ(rec.calls[i].count, counts[i]) << i;
  }
  Tensor f = gpu_f32(std::vector<float>(8, 1.f), {4, 2});
  all_reduce_tp(f, tp);
  EXPECT_EQ(rec.calls.back().type, comm::DataType::F32);
  // bf16 on the CPU has no collective (Gloo cannot reduce it): a clear error, nothing sent.
  Tensor c = Tensor::from_vector(std::vector<float>(8, 1.f), {4, 2}).to(DType::BF16);
  EXPECT_THROW(all_reduce_tp(c, tp), Error);
  EXPECT_EQ(rec.calls.size(), 4u);
}

// fp16 (--fp16) device tensors travel and are reduced as fp16, in place, as bf16 ones are.
TEST(GpuTensorParallel, CollectivesSendFp16DeviceTensorsAsFp16) {
  MT_REQUIRE_GPU();
  RecordingComm rec;
  TensorParallel tp;
  tp.comm = &rec;
  tp.sequence_parallel = true;
  std::vector<float> vals(24);
  for (size_t i = 0; i < vals.size(); ++i) vals[i] = round_bf16(0.37f * static_cast<float>(i) - 3.f);  // fp16-exact
  Tensor g = Tensor::from_vector(vals, {4, 6}).to(DType::F16).to_device(Device::CUDA);
  all_reduce_tp(g, tp);  // the recording communicator sums nothing: the values stay
  EXPECT_EQ(g.dtype(), DType::F16);
  EXPECT_EQ(host(g), vals);
  Tensor full = all_gather_rows(g, tp);
  Tensor shard = reduce_scatter_rows(g, tp);
  EXPECT_EQ(full.shape(), (Shape{8, 6}));
  EXPECT_EQ(full.dtype(), DType::F16);
  EXPECT_EQ(shard.shape(), (Shape{2, 6}));
  EXPECT_EQ(shard.dtype(), DType::F16);
  ASSERT_EQ(rec.calls.size(), 3u);
  const size_t counts[] = {24, 24, 12};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(rec.calls[i].type, comm::DataType::F16) << i;
    EXPECT_EQ(rec.calls[i].count, counts[i]) << i;
  }
  EXPECT_EQ(rec.calls[0].buf, g.raw());  // all-reduce in place, no widened copy
  EXPECT_EQ(rec.calls[1].buf, g.raw());  // all-gather from the shard itself
}

TransformerConfig gpu_llama() {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 128;
  c.num_attention_heads = 2;  // head dim 64
  c.num_query_groups = 2;
  c.ffn_hidden_size = 256;
  c.seq_length = 32;
  c.vocab_size = 256;
  c.orig_vocab_size = 250;
  c.normalization = "RMSNorm";
  c.swiglu = true;
  c.position_embedding_type = "rope";
  c.add_bias_linear = false;
  c.add_qkv_bias = false;
  c.untie_embeddings_and_output_weights = true;
  c.attention_dropout = 0.f;
  c.hidden_dropout = 0.f;
  c.init_method_std = 0.05f;
  c.bf16 = true;
  return c;
}

Batch masked_batch(int64_t B, int64_t S, int32_t V, uint64_t seed) {
  Batch b;
  b.B = B;
  b.S = S;
  b.tokens = random_ids(static_cast<size_t>(B * S), seed, V);
  b.labels = random_ids(static_cast<size_t>(B * S), seed + 1, V);
  for (int64_t i = 0; i < B * S; ++i) b.loss_mask.push_back(i % 5 == 3 ? 0.f : 1.f);
  return b;
}

// What the head used to do: the per-token losses of the saved logits summed on the host.
double host_loss_sum(const GPTModel::Saved& s, int64_t V) {
  const std::vector<float> logits = host(s.logits);
  const int64_t n = s.B * s.S;
  std::vector<float> loss(static_cast<size_t>(n)), lse(static_cast<size_t>(n));
  cpu::cross_entropy_forward(logits.data(), s.labels_sb.data(), loss.data(), lse.data(), n, V, V);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(loss[i]) * s.mask_sb[i];
  return sum;
}

double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

TEST(GpuGptModel, DeviceLossSumMatchesHostSum) {
  MT_REQUIRE_GPU();
  const TransformerConfig cfg = gpu_llama();
  const int32_t V = static_cast<int32_t>(cfg.orig_vocab_size);
  GPTModel gpu(cfg), cpu_model(cfg);  // same seed: the same initial parameters
  gpu.to_device(Device::CUDA);
  const Batch b1 = masked_batch(2, cfg.seq_length, V, 31), b2 = masked_batch(2, cfg.seq_length, V, 41);
  double tokens = 0;
  for (const Batch* b : {&b1, &b2})
    for (float m : b->loss_mask) tokens += m;

  PassContext ctx;
  GPTModel::Saved s1, s2;
  const LossSums r1 = gpu.forward(b1, s1, ctx);
  const LossSums r2 = gpu.forward(b2, s2, ctx);
  EXPECT_EQ(r1.loss_sum, 0.0);  // kept on the device
  EXPECT_EQ(r1.tokens + r2.tokens, tokens);
  const double want = host_loss_sum(s1, cfg.vocab_size) + host_loss_sum(s2, cfg.vocab_size);
  const double got = gpu.collect_device_loss();
  EXPECT_GT(want, 0.0);
  EXPECT_NEAR(got, want, 1e-5 * want);
  EXPECT_EQ(gpu.collect_device_loss(), 0.0);  // zeroed by the collection

  // Against the CPU model (bf16 emulated): the loss and the gradients that dloss = mask * scale
  // drives, within bf16 tolerances.
  GPTModel::Saved c1, c2;
  const LossSums q1 = cpu_model.forward(b1, c1, ctx), q2 = cpu_model.forward(b2, c2, ctx);
  EXPECT_EQ(q1.tokens + q2.tokens, tokens);
  EXPECT_NEAR(got, q1.loss_sum + q2.loss_sum, 1e-2 * (q1.loss_sum + q2.loss_sum));
  const float scale = static_cast<float>(1.0 / tokens);
  gpu.params().zero_grad();
  cpu_model.params().zero_grad();
  gpu.backward(s1, scale, ctx);
  gpu.backward(s2, scale, ctx);
  cpu_model.backward(c1, scale, ctx);
  cpu_model.backward(c2, scale, ctx);
  // A wrong mask or scale would move these by tens of percent.
  for (const char* name : {"output_layer.weight", "embedding.word_embeddings.weight"}) {
    const auto g = host(gpu.params().find(name)->grad), c = host(cpu_model.params().find(name)->grad);
    EXPECT_LT(rel_l2(g, c), 5e-2) << name;
  }
  EXPECT_EQ(gpu.collect_device_loss(), 0.0);  // backward adds nothing
}

// The training head with the loss gradient scale known at forward time (as the pipeline runs it):
// the fused cross-entropy forms dlogits in the forward, over the logits. Against the same model
// run without the scale (forward, then backward's two-kernel path): the same device loss sum and
// the same gradients within bf16 rounding of dlogits, and against the CPU model as above.
TEST(GpuGptModel, FusedLossHeadMatchesTwoPassHead) {
  MT_REQUIRE_GPU();
  const TransformerConfig cfg = gpu_llama();
  const int32_t V = static_cast<int32_t>(cfg.orig_vocab_size);
  GPTModel fused(cfg), two_pass(cfg), cpu_model(cfg);  // same seed: the same initial parameters
  fused.to_device(Device::CUDA);
  two_pass.to_device(Device::CUDA);
  const Batch b1 = masked_batch(2, cfg.seq_length, V, 51), b2 = masked_batch(2, cfg.seq_length, V, 61);
  double tokens = 0;
  for (const Batch* b : {&b1, &b2})
    for (float m : b->loss_mask) tokens += m;
  const float scale = static_cast<float>(1.0 / tokens);

  PassContext plain, known;
  known.loss_grad_scale = scale;
  GPTModel::Saved f1, f2, t1, t2, c1, c2;
  fused.params().zero_grad();
  two_pass.params().zero_grad();
  cpu_model.params().zero_grad();
  fused.forward(b1, f1, known);
  fused.forward(b2, f2, known);
  EXPECT_TRUE(f1.logits_are_grad && f2.logits_are_grad);
  two_pass.forward(b1, t1, plain);
  two_pass.forward(b2, t2, plain);
  EXPECT_FALSE(t1.logits_are_grad);
  const LossSums q1 = cpu_model.forward(b1, c1, plain), q2 = cpu_model.forward(b2, c2, plain);
  EXPECT_FALSE(c1.logits_are_grad);
  const double lf = fused.collect_device_loss(), lt = two_pass.collect_device_loss();
  EXPECT_NEAR(lf, lt, 1e-5 * lt);
  EXPECT_NEAR(lf, q1.loss_sum + q2.loss_sum, 1e-2 * (q1.loss_sum + q2.loss_sum));
  EXPECT_THROW(fused.backward(f1, 2 * scale, known), Error);  // not the scale its forward used
  fused.backward(f1, scale, known);
  fused.backward(f2, scale, known);
  two_pass.backward(t1, scale, plain);
  two_pass.backward(t2, scale, plain);
  cpu_model.backward(c1, scale, plain);
  cpu_model.backward(c2, scale, plain);
  for (const char* name :
       {"output_layer.weight", "embedding.word_embeddings.weight", "decoder.final_layernorm.weight"}) {
    const auto g = host(fused.params().find(name)->grad), t = host(two_pass.params().find(name)->grad),
               c = host(cpu_model.params().find(name)->grad);
    EXPECT_LT(rel_l2(g, t), 1e-2) << name;
    EXPECT_LT(rel_l2(g, c), 5e-2) << name;
  }
}

}  // namespace
}  // namespace mt::model

#endif  // MT_HAVE_CUDA
