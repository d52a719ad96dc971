#include "parallel/fp8_param_gather.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/ops.h"
#include "model/fp8.h"
#include "parallel/ddp.h"

namespace mt::parallel {

namespace {

// Casts main [a, b) (inside weight p, rows of C) into codes [a - base, b - base): the partial
// first row, the whole rows, the partial last row, each as a 2-D cast (the cast kernel's shape).
void cast_range(const Tensor& main, Tensor& codes, int64_t base, const model::Param& p, int64_t a, int64_t b,
                const Tensor& scale, Fp8Format fmt, Tensor& scratch_amax, Tensor& saturated) {
  const int64_t C = p.shape.back();
  auto piece = [&](int64_t from, int64_t rows, int64_t cols) {
    if (rows * cols == 0) return;
    const Tensor x = main.flat_range(from, {rows, cols});
    Tensor q = codes.flat_range(from - base, {rows, cols});
    ops::fp8_cast_transpose(x, scale, fmt, q, nullptr, scratch_amax, saturated);
  };
  int64_t at = a;
  const int64_t col = (a - p.offset) % C;
  if (col != 0) {
    const int64_t n = std::min(C - col, b - a);
    piece(at, 1, n);
    at += n;
  }
  const int64_t rows = (b - at) / C;
  piece(at, rows, C);
  at += rows * C;
  piece(at, 1, b - at);
}

}  // namespace

void cast_fp8_bucket(Fp8Bucket& f, const Bucket& k, model::ParamStore& ps, int64_t lo, int64_t hi,
                     comm::Communicator* group, bool roll) {
  const Tensor& main = ps.main_buffer();
  const Device dev = main.device();
  if (f.weights.empty())
    for (const model::Param* p : k.params)
      if (p->fp8_gathered) f.weights.push_back(p);
  const int64_t n = static_cast<int64_t>(f.weights.size());
  if (!f.codes.defined() || f.codes.device() != dev) {
    f.codes = Tensor::zeros({k.end - k.begin}, DType::U8, dev);
    f.amaxes = Tensor::zeros({n}, DType::F32, dev);
  }
  // Delayed scaling's deferred update: the previous cast's amax moves its scale on now.
  for (const model::Param* p : f.weights) {
    model::Fp8LinearState& s = *p->fp8_gathered->state;
    const model::Fp8Config& c = p->fp8_gathered->store->config();
    if (roll && s.weight_roll_pending && c.recipe == model::Fp8Recipe::Delayed)
      ops::fp8_delayed_update(s.weight.history, s.weight.scale, s.weight.amax, fp8_max(c.forward_format()),
                              static_cast<int>(c.margin), c.amax_max);
    s.weight_roll_pending = false;
  }
  // The shard amaxes (0 where a weight lies outside [lo, hi)), reduced to the whole weights'.
  f.amaxes.zero_();
  const model::TensorParallel* tp = nullptr;
  for (int64_t i = 0; i < n; ++i) {
    const model::Param& p = *f.weights[static_cast<size_t>(i)];
    const int64_t a = std::max(lo, p.offset), b = std::min(hi, p.offset + p.numel());
    if (a < b) {
      Tensor ai = f.amaxes.slice(i, 1);
      ops::fp8_amax(main.slice(a, b - a), ai);
    }
    const model::TensorParallel* t = p.fp8_gathered->tp;
    MT_CHECK(i == 0 || t == tp, "FP8 parameter gather: the weights of one bucket under different TP groups ({})",
             p.name);
    tp = t;
  }
  if (n > 0 && group && group->size() > 1)
    group->all_reduce(f.amaxes.raw(), static_cast<size_t>(n), comm::DataType::F32, comm::ReduceOp::Max);
  if (n > 0 && tp && tp->on())
    tp->comm->all_reduce(f.amaxes.raw(), static_cast<size_t>(n), comm::DataType::F32, comm::ReduceOp::Max);
  Tensor scratch = Tensor::zeros({1}, DType::F32, dev);  // the cast's own amax: already known
  for (int64_t i = 0; i < n; ++i) {
    const model::Param& p = *f.weights[static_cast<size_t>(i)];
    model::Fp8LinearState& s = *p.fp8_gathered->state;
    const model::Fp8Config& c = p.fp8_gathered->store->config();
    const Fp8Format fmt = c.forward_format();
    ops::copy_into(s.weight.amax, f.amaxes.slice(i, 1));
    if (c.recipe == model::Fp8Recipe::Tensorwise) ops::fp8_current_scale(s.weight.amax, s.weight.scale, fp8_max(fmt));
    s.weight_scale = Tensor::empty({1}, DType::F32, dev);
    s.weight_scale_inv = Tensor::empty({1}, DType::F32, dev);
    ops::fp8_snapshot_scale(s.weight.scale, s.weight_scale, s.weight_scale_inv);
    const int64_t a = std::max(lo, p.offset), b = std::min(hi, p.offset + p.numel());
    if (a < b) cast_range(main, f.codes, k.begin, p, a, b, s.weight_scale, fmt, scratch, s.weight.saturated);
    s.weight_codes = f.codes.flat_range(p.offset - k.begin, p.shape);
    s.weight_q = Tensor();  // read back again from the new codes
    s.weight_roll_pending = true;
  }
}

}  // namespace mt::parallel
