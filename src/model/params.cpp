#include "model/params.h"

#include <cmath>

#include "core/error.h"

namespace mt::model {

Param& ParamStore::add(const std::string& name, const Shape& shape, Init init, bool weight_decay) {
  MT_CHECK(!allocated_, "parameter {} added after allocation", name);
  Param p;
  p.name = name;
  p.shape = shape;
  p.init = init;
  p.weight_decay = weight_decay;
  p.offset = total_;
  total_ += p.numel();
  params_.push_back(std::move(p));
  return params_.back();
}

void ParamStore::allocate(bool bf16_model_copy) {
  bf16_ = bf16_model_copy;
  main_ = Tensor::zeros({total_});
  grad_ = Tensor::zeros({total_});
  model_ = bf16_ ? Tensor::zeros({total_}) : main_;
  for (auto& p : params_) {
    p.main = main_.flat_range(p.offset, p.shape);
    p.grad = grad_.flat_range(p.offset, p.shape);
    p.value = model_.flat_range(p.offset, p.shape);
  }
  allocated_ = true;
}

void ParamStore::initialize(uint64_t seed, float std, int64_t num_layers) {
  MT_CHECK(allocated_, "initialize before allocate");
  uint64_t index = 0;
  for (auto& p : params_) {
    RngState rng{seed, (index++) << 40};
    float* d = p.main.data<float>();
    switch (p.init) {
      case Init::Normal: rng.normal(d, p.numel(), 0.f, std); break;
      case Init::ScaledNormal:
        rng.normal(d, p.numel(), 0.f, std / std::sqrt(2.0f * static_cast<float>(num_layers)));
        break;
      case Init::Zeros: p.main.zero_(); break;
      case Init::Ones: p.main.fill_(1.f); break;
    }
  }
  sync_model_from_main();
}

void ParamStore::sync_model_from_main() {
  if (!bf16_) return;
  const float* s = main_.data<float>();
  float* d = model_.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < total_; ++i) d[i] = round_bf16(s[i]);
}

void ParamStore::zero_grad() { grad_.zero_(); }

Param* ParamStore::find(const std::string& name) {
  for (auto& p : params_)
    if (p.name == name) return &p;
  return nullptr;
}

std::vector<optim::ParamSpan> ParamStore::spans() const {
  std::vector<optim::ParamSpan> out;
  for (const auto& p : params_) out.push_back({p.offset, p.numel(), p.weight_decay});
  return out;
}

}  // namespace mt::model
