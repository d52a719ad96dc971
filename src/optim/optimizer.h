#pragma once
// Optimizers over the model's flat fp32 main params and main grads (one contiguous buffer
// each, DESIGN.md). A ParamSpan tells which ranges get weight decay (Megatron: no decay on
// biases and norm weights, i.e. on 1-D params).
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace mt::optim {

struct ParamSpan {
  int64_t offset = 0;
  int64_t numel = 0;
  bool weight_decay = true;
};

struct OptimizerConfig {
  std::string type = "adam";  // --optimizer adam|sgd (adam is AdamW: decoupled weight decay, as Megatron)
  float lr = 1e-4f;
  float weight_decay = 0.01f;
  float adam_beta1 = 0.9f, adam_beta2 = 0.999f, adam_eps = 1e-8f;
  float sgd_momentum = 0.9f;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update of params[0:numel) from grads, with this step's lr and weight decay.
  virtual void step(float* params, const float* grads, float lr, float weight_decay) = 0;
  // State tensors for checkpoints: name -> fp32 array of numel (e.g. "exp_avg", "exp_avg_sq"),
  // plus the step count.
  virtual std::vector<std::pair<std::string, std::vector<float>*>> state() = 0;
  virtual int64_t step_count() const = 0;
  virtual void set_step_count(int64_t n) = 0;
};

// AdamW (optim/adamw.h) or SGD (optim/sgd.h) over a flat buffer of numel. Spans must not
// overlap; elements outside every span get weight decay. Throws mt::Error naming the flag
// for invalid settings (--optimizer, --adam-beta1, ...).
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& cfg, int64_t numel, std::vector<ParamSpan> spans);

// Global L2 norm of grads (fp64 accumulation, fixed order: thread-count independent).
double grad_norm_squared(const float* grads, int64_t n);
// Scales grads by min(1, max_norm / (norm + 1e-6)) as Megatron's clip_grad_norm does.
void clip_grads(float* grads, int64_t n, double total_norm, double max_norm);

}  // namespace mt::optim
