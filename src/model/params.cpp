#include "model/params.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "core/error.h"
#include "kernels/ops.h"

namespace mt::model {

namespace {
// FNV-1a of the name, top bit set: far from the small sequential offsets dropout draws with
// the same seed, and the same on every pipeline stage that holds the parameter.
uint64_t init_stream(const std::string& name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h | (1ull << 63);
}
}  // namespace

Param& ParamStore::add(const std::string& name, const Shape& full_shape, Init init, bool weight_decay, TPSplit tp) {
  MT_CHECK(!allocated_, "parameter {} added after allocation", name);
  Param p;
  p.name = name;
  p.full_shape = full_shape;
  p.shape = full_shape;
  p.tp = tp;
  if (tp.sharded()) {
    MT_CHECK(tp.dim < static_cast<int>(full_shape.size()), "{}: split dim {}", name, tp.dim);
    int64_t& d = p.shape[static_cast<size_t>(tp.dim)];
    MT_CHECK(d % (tp.blocks * tp.size) == 0, "{}: dim {} of {} does not split into {} x {}", name, tp.dim, d,
             tp.blocks, tp.size);
    d /= tp.size;
  }
  p.init = init;
  p.weight_decay = weight_decay;
  p.offset = total_;
  total_ += p.numel();
  params_.push_back(std::move(p));
  return params_.back();
}

void ParamStore::allocate(Half model_copy, const LayoutFn& layout) {
  half_ = model_copy;
  if (layout) {
    BufferLayout l = layout(params_);
    MT_CHECK(l.offsets.size() == params_.size(), "layout gives {} offsets for {} params", l.offsets.size(),
             params_.size());
    size_t i = 0;
    for (auto& p : params_) {
      p.offset = l.offsets[i++];
      MT_CHECK(p.offset >= 0 && p.offset + p.numel() <= l.total, "{} placed outside the buffer", p.name);
    }
    total_ = l.total;
  }
  main_ = Tensor::zeros({total_});
  grad_ = Tensor::zeros({total_});
  model_ = half_ != Half::None ? Tensor::zeros({total_}) : main_;
  for (auto& p : params_) {
    p.main = main_.flat_range(p.offset, p.shape);
    p.grad = grad_.flat_range(p.offset, p.shape);
    p.value = model_.flat_range(p.offset, p.shape);
  }
  allocated_ = true;
}

namespace {
// Walks the shard's elements as runs: outer = product of dims before `dim`, and per outer
// index, for every block, one contiguous run of (part length x inner) elements.
template <typename F>
void for_each_shard_run(const Param& p, F&& f) {
  if (!p.tp.sharded()) {
    f(int64_t{0}, int64_t{0}, p.numel());
    return;
  }
  const size_t dim = static_cast<size_t>(p.tp.dim);
  int64_t outer = 1, inner = 1;
  for (size_t i = 0; i < dim; ++i) outer *= p.full_shape[i];
  for (size_t i = dim + 1; i < p.full_shape.size(); ++i) inner *= p.full_shape[i];
  const int64_t full_d = p.full_shape[dim], block = full_d / p.tp.blocks, part = block / p.tp.size;
  int64_t shard_pos = 0;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t b = 0; b < p.tp.blocks; ++b) {
      const int64_t full_pos = (o * full_d + b * block + p.tp.rank * part) * inner;
      f(full_pos, shard_pos, part * inner);
      shard_pos += part * inner;
    }
}
constexpr int64_t kInitPiece = int64_t{1} << 16;  // draws per parallel piece of a sharded init
}  // namespace

void ParamStore::initialize(uint64_t seed, float std, int64_t num_layers) {
  MT_CHECK(allocated_, "initialize before allocate");
  for (auto& p : params_) {
    RngState rng{seed, init_stream(p.name)};
    const bool random = p.init == Init::Normal || p.init == Init::ScaledNormal;
    const float sd = p.init == Init::Normal ? std : std / std::sqrt(2.0f * static_cast<float>(num_layers));
    if (random && p.tp.sharded()) {
      // Only this rank's runs of the full weight's stream: the same values as drawing the
      // whole weight and cutting the shard out, without every rank drawing every weight.
      // Pieces of at most 64k draws spread the many short runs of a row-parallel weight and
      // the few long runs of a column-parallel one evenly over the threads.
      const uint64_t off = rng.next_offset();
      float* shard = p.main.data<float>();
      std::vector<std::array<int64_t, 3>> pieces;  // (position in the full weight, in the shard, length)
      for_each_shard_run(p, [&](int64_t fp, int64_t sp, int64_t n) {
        for (int64_t b = 0; b < n; b += kInitPiece) pieces.push_back({fp + b, sp + b, std::min(kInitPiece, n - b)});
      });
#pragma omp parallel for schedule(static)
      for (size_t i = 0; i < pieces.size(); ++i)
        rng.normal_slice(off, pieces[i][0], pieces[i][2], shard + pieces[i][1], 0.f, sd);
      continue;
    }
    float* d = p.main.data<float>();
    switch (p.init) {
      case Init::Normal:
      case Init::ScaledNormal: rng.normal(d, p.numel(), 0.f, sd); break;
      case Init::Zeros: p.main.zero_(); break;
      case Init::Ones: p.main.fill_(1.f); break;
    }
  }
  sync_model_from_main();
}

void ParamStore::to_device(Device d) {
  MT_CHECK(allocated_, "to_device before allocate");
  if (d == main_.device()) return;
  MT_CHECK(d == Device::CUDA && half_ != Half::None, "parameters move to the GPU only as bf16 or fp16 models");
  // fp32 main params and grads on the device; the compute copy becomes a real bf16 (fp16) tensor.
  main_ = main_.to_device(d);
  grad_ = Tensor::zeros({total_}, DType::F32, d);
  model_ = Tensor::empty({total_}, half_ == Half::FP16 ? DType::F16 : DType::BF16, d);
  for (auto& p : params_) {
    p.main = main_.flat_range(p.offset, p.shape);
    p.grad = grad_.flat_range(p.offset, p.shape);
    p.value = model_.flat_range(p.offset, p.shape);
  }
  sync_model_from_main();
}

void ParamStore::sync_model_from_main() {
  if (half_ == Half::None) return;
  if (main_.device() != Device::CPU) {
    ops::cast(main_, model_);
    return;
  }
  const float* s = main_.data<float>();
  float* d = model_.data<float>();
  if (half_ == Half::FP16) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < total_; ++i) d[i] = ops::round_f16(s[i]);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < total_; ++i) d[i] = round_bf16(s[i]);
}

void ParamStore::sync_model_from_main(int64_t begin, int64_t end) {
  if (half_ == Half::None) return;
  if (main_.device() != Device::CPU) {
    Tensor dst = model_.flat_range(begin, {end - begin});
    ops::cast(main_.flat_range(begin, {end - begin}), dst);
    return;
  }
  const float* s = main_.data<float>();
  float* d = model_.data<float>();
  if (half_ == Half::FP16) {
#pragma omp parallel for schedule(static)
    for (int64_t i = begin; i < end; ++i) d[i] = ops::round_f16(s[i]);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = begin; i < end; ++i) d[i] = round_bf16(s[i]);
}

void ParamStore::zero_grad() {
  // Zero everything outside the GEMM-written parameters, merging neighbours into few ranges.
  std::vector<std::pair<int64_t, int64_t>> skip;
  for (Param& p : params_)
    if (p.gemm_only_grad) {
      p.overwrite_grad = true;
      skip.push_back({p.offset, p.offset + p.numel()});
    }
  std::sort(skip.begin(), skip.end());
  const int64_t total = grad_.numel();
  int64_t at = 0;
  for (auto [lo, hi] : skip) {
    if (lo > at) grad_.flat_range(at, {lo - at}).zero_();
    at = std::max(at, hi);
  }
  if (at < total) grad_.flat_range(at, {total - at}).zero_();
}

void ParamStore::zero_unwritten_grads() {
  for (Param& p : params_)
    if (p.overwrite_grad) {
      p.grad.zero_();
      p.overwrite_grad = false;
    }
}

void extract_shard(const Param& p, const float* full, float* shard) {
  for_each_shard_run(p, [&](int64_t fp, int64_t sp, int64_t n) { std::copy_n(full + fp, n, shard + sp); });
}

void insert_shard(const Param& p, const float* shard, float* full) {
  for_each_shard_run(p, [&](int64_t fp, int64_t sp, int64_t n) { std::copy_n(shard + sp, n, full + fp); });
}

Param* ParamStore::find(const std::string& name) {
  for (auto& p : params_)
    if (p.name == name) return &p;
  return nullptr;
}

std::vector<optim::ParamSpan> ParamStore::spans() const {
  std::vector<optim::ParamSpan> out;
  for (const auto& p : params_) out.push_back({p.offset, p.numel(), p.weight_decay, p.embedding_or_output});
  return out;
}

}  // namespace mt::model
