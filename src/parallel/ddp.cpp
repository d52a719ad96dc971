#include "parallel/ddp.h"

#include <functional>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "kernels/ops.h"

namespace mt::parallel {

int64_t effective_bucket_size(const DDPOptions& o, int dp_size) {
  if (o.bucket_size > 0) return o.bucket_size;
  if (!o.overlap_grad_reduce) return std::numeric_limits<int64_t>::max();
  return std::max<int64_t>(40000000, 1000000 * static_cast<int64_t>(dp_size));
}

DataParallel::DataParallel(comm::CommPtr dp, const DDPOptions& opts, comm::CommPtr edp)
    : dp_(std::move(dp)), edp_(edp ? std::move(edp) : dp_), opts_(opts) {}

bool DataParallel::sharded() const {
  return opts_.use_distributed_optimizer && (dp_->size() > 1 || experts_sharded());
}

// Buckets of the dense (or the expert; or the FP8-gathered) parameters in backward (reverse
// registration) order.
void DataParallel::plan_buckets(const std::deque<model::Param>& params, bool expert, bool fp8) {
  const int64_t limit = effective_bucket_size(opts_, (expert ? edp_ : dp_)->size());
  std::vector<size_t> cur;
  int64_t cur_n = 0;
  auto close = [&] {
    if (cur.empty()) return;
    bucket_params_.push_back(std::move(cur));
    bucket_expert_.push_back(expert);
    bucket_fp8_.push_back(fp8);
    cur.clear();
    cur_n = 0;
  };
  for (size_t i = params.size(); i-- > 0;) {
    if (params[i].expert != expert || (params[i].fp8_gathered != nullptr) != fp8) continue;
    if (opts_.use_distributed_optimizer && params[i].shared_embedding) {
      // Megatron: a tied embedding split over pipeline stages gets a bucket of its own, so
      // the first and last stage shard it alike over DP and the embedding-group sum of the
      // reduce-scattered gradient adds matching slices.
      close();
      cur.push_back(i);
      close();
      continue;
    }
    cur.push_back(i);
    cur_n += params[i].numel();
    if (cur_n >= limit) close();
  }
  close();
}

model::LayoutFn DataParallel::layout_fn() {
  return [this](const std::deque<model::Param>& params) {
    bucket_params_.clear();
    bucket_expert_.clear();
    bucket_fp8_.clear();
    plan_buckets(params, false, false);
    const size_t plain = bucket_params_.size();
    plan_buckets(params, false, true);
    has_fp8_ = bucket_params_.size() > plain;
    const size_t dense = bucket_params_.size();
    plan_buckets(params, true, false);
    has_expert_ = bucket_params_.size() > dense;
    // Offsets: the dense parameters first, then the experts; within each the first-registered
    // first, so a dense model's buffer keeps registration order. Each bucket ends padded to a
    // multiple of its group's size (gaps stay zero).
    model::BufferLayout l;
    l.offsets.assign(params.size(), 0);
    buckets_.assign(bucket_params_.size(), Bucket{});
    int64_t pos = 0;
    auto place = [&](size_t lo, size_t hi) {
      for (size_t b = hi; b-- > lo;) {
        Bucket& k = buckets_[b];
        k.expert = bucket_expert_[b];
        k.fp8 = bucket_fp8_[b];
        k.group = (k.expert ? edp_ : dp_).get();
        const int64_t pad = opts_.use_distributed_optimizer ? k.group->size() : 1;
        k.begin = pos;
        for (size_t j = bucket_params_[b].size(); j-- > 0;) {
          size_t i = bucket_params_[b][j];
          l.offsets[i] = pos;
          pos += params[i].numel();
        }
        pos = (pos + pad - 1) / pad * pad;
        k.end = pos;
      }
    };
    place(0, dense);
    place(dense, buckets_.size());
    l.total = pos;
    return l;
  };
}

void DataParallel::attach(model::ParamStore& ps) {
  ps_ = &ps;
  MT_CHECK(!buckets_.empty() || ps.params().empty(), "DataParallel::attach without its layout");
  size_t idx = 0;
  std::vector<const model::Param*> by_index;
  for (const auto& p : ps.params()) by_index.push_back(&p);
  for (size_t b = 0; b < bucket_params_.size(); ++b)
    for (size_t i : bucket_params_[b]) {
      buckets_[b].params.push_back(by_index[i]);
      bucket_of_[by_index[i]] = b;
      ++idx;
    }
  MT_CHECK(idx == by_index.size(), "{} of {} parameters in buckets", idx, by_index.size());
  grad_work_.assign(buckets_.size(), nullptr);
  gather_work_.assign(buckets_.size(), nullptr);
  ready_count_.assign(buckets_.size(), 0);
  fp8_.assign(buckets_.size(), Fp8Bucket{});
  fp8_stale_ = true;
}

void DataParallel::start_iteration() {
  std::fill(ready_count_.begin(), ready_count_.end(), 0);
  std::fill(grad_work_.begin(), grad_work_.end(), nullptr);
  last_microbatch_ = true;
}

void DataParallel::launch(size_t b) {
  const Bucket& k = buckets_[b];
  comm::Communicator& c = *k.group;
  if (grad_work_[b] || c.size() == 1) return;
  float* g = ps_->grad_buffer().data<float>();
  const size_t n = static_cast<size_t>(k.end - k.begin);
  if (bucket_sharded(k)) {
    const size_t chunk = n / static_cast<size_t>(c.size());
    grad_work_[b] = c.reduce_scatter_async(g + k.begin, g + k.begin + static_cast<int64_t>(chunk) * c.rank(), chunk,
                                           comm::DataType::F32, comm::ReduceOp::Sum);
  } else {
    grad_work_[b] = c.all_reduce_async(g + k.begin, n, comm::DataType::F32, comm::ReduceOp::Sum);
  }
}

void DataParallel::grad_ready(const model::Param& p) {
  if (!opts_.overlap_grad_reduce || !last_microbatch_) return;
  auto it = bucket_of_.find(&p);
  if (it == bucket_of_.end()) return;
  const size_t b = it->second;
  if (++ready_count_[b] == static_cast<int>(buckets_[b].params.size())) launch(b);
}

void DataParallel::finish_grad_sync() {
  for (size_t b = 0; b < buckets_.size(); ++b) launch(b);
  for (auto& w : grad_work_)
    if (w) w->wait();
}

std::pair<int64_t, int64_t> DataParallel::owned_range(const Bucket& k) const {
  if (!bucket_sharded(k)) return {k.begin, k.end};
  const int64_t chunk = (k.end - k.begin) / k.group->size();
  return {k.begin + chunk * k.group->rank(), k.begin + chunk * (k.group->rank() + 1)};
}

std::vector<std::pair<int64_t, int64_t>> DataParallel::owned_ranges() const {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const Bucket& k : buckets_) out.push_back(owned_range(k));
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<optim::ParamSpan> spans_within(const std::vector<optim::ParamSpan>& spans, int64_t lo, int64_t hi) {
  std::vector<optim::ParamSpan> local;
  for (const auto& s : spans) {
    const int64_t a = std::max(lo, s.offset), b = std::min(hi, s.offset + s.numel);
    if (a < b) local.push_back({a - lo, b - a, s.weight_decay, s.decoupled_lr});
  }
  return local;
}

namespace {
// Adam (or SGD) on a set of disjoint flat ranges, each with its own state: the distributed
// optimizer's shard, on either device. Elementwise updates make this identical to stepping the
// full buffer.
class ShardedOptimizer final : public optim::Optimizer {
 public:
  ShardedOptimizer(const optim::OptimizerConfig& cfg, const std::vector<std::pair<int64_t, int64_t>>& ranges,
                   const std::vector<optim::ParamSpan>& spans, Device device) {
    for (auto [lo, hi] : ranges)
      parts_.push_back({lo, hi, optim::make_optimizer(cfg, hi - lo, spans_within(spans, lo, hi), device)});
  }
  void update(Tensor& params, const Tensor& grads, const optim::StepRates& rates, const ops::HalfCopy& copy) override {
    for (auto& p : parts_) {
      const int64_t n = p.hi - p.lo;
      Tensor part = params.flat_range(p.lo, {n});
      p.opt->update(part, grads.flat_range(p.lo, {n}), rates, copy.part(p.lo, n));
    }
  }
  // Each owned range's tensors in turn, in owned_ranges() order, placed at their range: checkpoints
  // store them per global tensor slice (checkpoint::optimizer_state).
  std::vector<optim::StateTensor> state() override {
    std::vector<optim::StateTensor> out;
    for (auto& p : parts_)
      for (auto& s : p.opt->state()) {
        s.lo += p.lo;
        s.hi += p.lo;
        out.push_back(std::move(s));
      }
    return out;
  }
  int64_t step_count() const override { return parts_.empty() ? 0 : parts_.front().opt->step_count(); }
  void set_step_count(int64_t n) override {
    for (auto& p : parts_) p.opt->set_step_count(n);
  }

 private:
  struct Part {
    int64_t lo, hi;
    std::unique_ptr<optim::Optimizer> opt;
  };
  std::vector<Part> parts_;
};
}  // namespace

std::unique_ptr<optim::Optimizer> DataParallel::make_optimizer(const optim::OptimizerConfig& cfg) const {
  if (!sharded()) return optim::make_optimizer(cfg, ps_->numel(), ps_->spans(), ps_->device());
  return std::make_unique<ShardedOptimizer>(cfg, owned_ranges(), ps_->spans(), ps_->device());
}

void DataParallel::start_param_gather() {
  if (!sharded() && !has_fp8_) return;
  float* m = ps_->main_buffer().data<float>();
  // Forward order: the bucket holding the first layers is needed first.
  for (size_t b = buckets_.size(); b-- > 0;) {
    const Bucket& k = buckets_[b];
    if (k.fp8) {
      start_fp8_gather(b, true);
      continue;
    }
    if (!sharded()) continue;  // the optimizer's update wrote the compute copy
    if (!bucket_sharded(k)) {  // stepped whole here (DP 1 beside a sharded EDP, or the reverse)
      ps_->sync_model_from_main(k.begin, k.end);
      continue;
    }
    comm::Communicator& c = *k.group;
    const int64_t chunk = (k.end - k.begin) / c.size();
    gather_work_[b] = c.all_gather_async(m + k.begin + chunk * c.rank(), m + k.begin, static_cast<size_t>(chunk),
                                         comm::DataType::F32);
  }
  fp8_stale_ = false;
  if (!opts_.overlap_param_gather) finish_param_gather();
}

void DataParallel::start_fp8_gather(size_t b, bool roll) {
  const Bucket& k = buckets_[b];
  const bool shard = bucket_sharded(k);
  const auto [lo, hi] = owned_range(k);
  Fp8Bucket& f = fp8_[b];
  cast_fp8_bucket(f, k, *ps_, lo, hi, shard ? k.group : nullptr, roll);
  if (!shard) return;
  uint8_t* codes = f.codes.data<uint8_t>();
  gather_work_[b] = k.group->all_gather_async(codes + (lo - k.begin), codes, static_cast<size_t>(hi - lo),
                                              comm::DataType::U8);
}

void DataParallel::prepare_fp8_params() {
  if (!has_fp8_ || !fp8_stale_) return;
  for (size_t b = buckets_.size(); b-- > 0;)
    if (buckets_[b].fp8) start_fp8_gather(b, false);
  fp8_stale_ = false;
  if (!opts_.overlap_param_gather) finish_param_gather();
}

void DataParallel::gather_main_values() {
  finish_param_gather();
  float* m = ps_->main_buffer().data<float>();
  for (const Bucket& k : buckets_) {
    if (!k.fp8 || !bucket_sharded(k)) continue;
    const auto [lo, hi] = owned_range(k);
    k.group->all_gather(m + lo, m + k.begin, static_cast<size_t>(hi - lo), comm::DataType::F32);
  }
}

void DataParallel::wait_gather(size_t b) {
  if (!gather_work_[b]) return;
  gather_work_[b]->wait();
  gather_work_[b] = nullptr;
  // FP8 codes land where the linears read them; the model's copy of those weights is not kept.
  if (!buckets_[b].fp8) ps_->sync_model_from_main(buckets_[b].begin, buckets_[b].end);
}

void DataParallel::finish_param_gather() {
  for (size_t b = buckets_.size(); b-- > 0;) wait_gather(b);
}

bool DataParallel::gathers_pending() const {
  return std::any_of(gather_work_.begin(), gather_work_.end(), [](const comm::WorkHandle& w) { return w != nullptr; });
}

void DataParallel::before_use(const model::Param& p) {
  auto it = bucket_of_.find(&p);
  if (it != bucket_of_.end()) wait_gather(it->second);
}

namespace {

// The owned parts of the dense (or the expert) parameters that this rank counts in a global
// norm: TP (ETP) shards on every rank of their group, replicated ones on its rank 0, a tied
// embedding's pipeline replica not at all.
std::vector<std::pair<int64_t, int64_t>> counted_ranges(model::ParamStore& ps,
                                                        const std::vector<std::pair<int64_t, int64_t>>& owned,
                                                        int tp_rank, bool expert) {
  std::vector<std::pair<int64_t, int64_t>> counted;  // flat ranges, in buffer order per parameter
  for (const auto& p : ps.params()) {
    if (p.expert != expert) continue;
    if (!p.tp.sharded() && tp_rank != 0) continue;  // a TP-replicated parameter counts once
    if (p.replica) continue;                         // a tied embedding counts on the first stage
    for (auto [lo, hi] : owned) {
      const int64_t a = std::max(lo, p.offset), b = std::min(hi, p.offset + p.numel());
      if (a < b) counted.emplace_back(a, b);
    }
  }
  return counted;
}

double owned_squares(model::ParamStore& ps, const std::vector<std::pair<int64_t, int64_t>>& owned, int tp_rank,
                     bool expert) {
  return ops::grad_norm_squared(ps.grad_buffer(), counted_ranges(ps, owned, tp_rank, expert));
}

using RangesFn = std::function<double(const std::vector<std::pair<int64_t, int64_t>>&)>;

// A per-element sum (`local` over this rank's counted ranges) reduced to the global value the
// way the grad norm is: dense over TP x PP (and DP when sharded), experts over ETP x EP x PP
// (and expert DP when sharded).
double global_sum(model::ParamStore& ps, const DataParallel& ddp, const ProcessGroups& pg, bool moe,
                  const RangesFn& local) {
  const auto owned = ddp.owned_ranges();
  double v = pg.mp->all_reduce_value(local(counted_ranges(ps, owned, pg.tp_rank(), false)));
  // The distributed optimizer shards over DP x CP (the ranks that reduce dense gradients).
  if (ddp.sharded() && pg.dp_cp->size() > 1) v = pg.dp_cp->all_reduce_value(v);
  if (!moe) return v;
  double ex = pg.expert_mp->all_reduce_value(local(counted_ranges(ps, owned, pg.etp->rank(), true)));
  if (ddp.experts_sharded()) ex = pg.edp->all_reduce_value(ex);
  return v + ex;
}

}  // namespace

double global_grad_norm(model::ParamStore& ps, const std::vector<std::pair<int64_t, int64_t>>& owned, int tp_rank,
                        comm::Communicator& mp, comm::Communicator* dp_if_sharded) {
  double sq = mp.all_reduce_value(owned_squares(ps, owned, tp_rank, false));
  if (dp_if_sharded) sq = dp_if_sharded->all_reduce_value(sq);
  return std::sqrt(sq);
}

double global_grad_norm(model::ParamStore& ps, const DataParallel& ddp, const ProcessGroups& pg, bool moe) {
  return std::sqrt(global_sum(ps, ddp, pg, moe, [&](const auto& r) { return ops::grad_norm_squared(ps.grad_buffer(), r); }));
}

double global_params_norm(model::ParamStore& ps, const DataParallel& ddp, const ProcessGroups& pg, bool moe) {
  // The fp32 main parameters: the same sum of squares as the gradients' (the op reads any fp32 buffer).
  return std::sqrt(global_sum(ps, ddp, pg, moe, [&](const auto& r) { return ops::grad_norm_squared(ps.main_buffer(), r); }));
}

double global_grad_zeros(model::ParamStore& ps, const DataParallel& ddp, const ProcessGroups& pg, bool moe) {
  // A diagnostic (--log-num-zeros-in-grad): counted on the host, copying device ranges over.
  return global_sum(ps, ddp, pg, moe, [&](const auto& ranges) {
    double zeros = 0;
    for (auto [lo, hi] : ranges) {
      const Tensor h = ps.grad_buffer().slice(lo, hi - lo).to_device(Device::CPU);
      const float* g = h.data<float>();
      for (int64_t i = 0; i < hi - lo; ++i) zeros += g[i] == 0.f ? 1.0 : 0.0;
    }
    return zeros;
  });
}

void all_reduce_sequence_parallel_grads(model::ParamStore& ps, comm::Communicator& tp) {
  if (tp.size() == 1) return;
  if (ps.grad_buffer().device() != Device::CPU) {
    // On the GPU: reduce each one in place (NCCL on device memory, no host copy); the
    // sequence-parallel parameters are the small norm weights and biases.
    std::vector<comm::WorkHandle> work;
    for (auto& p : ps.params())
      if (p.sequence_parallel)
        work.push_back(tp.all_reduce_async(p.grad.raw(), static_cast<size_t>(p.numel()), comm::DataType::F32,
                                           comm::ReduceOp::Sum));
    for (auto& w : work) w->wait();
    return;
  }
  std::vector<float> buf;
  for (const auto& p : ps.params())
    if (p.sequence_parallel) buf.insert(buf.end(), p.grad.data<float>(), p.grad.data<float>() + p.numel());
  if (buf.empty()) return;
  tp.all_reduce(buf.data(), buf.size());
  size_t pos = 0;
  for (auto& p : ps.params())
    if (p.sequence_parallel) {
      std::copy_n(buf.data() + pos, p.numel(), p.grad.data<float>());
      pos += static_cast<size_t>(p.numel());
    }
}

void all_reduce_embedding_grads(model::ParamStore& ps, comm::Communicator& embedding) {
  if (embedding.size() == 1) return;
  for (auto& p : ps.params())
    if (p.shared_embedding) embedding.all_reduce(p.grad.data<float>(), static_cast<size_t>(p.numel()));
}

}  // namespace mt::parallel
