#pragma once
// Optimizers over the model's flat fp32 main params and main grads (one contiguous buffer each,
// DESIGN.md), on the device of that buffer: the update is an op (ops::adamw_step, ops::sgd_step)
// and the state is a set of fp32 tensors beside the params, so one class serves the CPU and the
// GPU. A ParamSpan tells which ranges get weight decay (Megatron: no decay on biases and norm
// weights, i.e. on 1-D params) and which belong to the decoupled learning-rate group (Megatron's
// --decoupled-lr: the word embedding and the output layer, its is_embedding_or_output_parameter).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/ops.h"

namespace mt::optim {

struct ParamSpan {
  int64_t offset = 0;
  int64_t numel = 0;
  bool weight_decay = true;
  bool decoupled_lr = false;
};

// One update's rates from the schedule: `lr` for the default group, `decoupled_lr` for the
// decoupled group (equal to `lr` without --decoupled-lr), one weight decay for both (Megatron's
// groups differ only in max_lr/min_lr).
struct StepRates {
  double lr = 0, decoupled_lr = 0, weight_decay = 0;
  // Gradient clipping applied as the grads are read (ops::clip_coefficient; 1: none), which
  // leaves the grads as they were.
  float grad_scale = 1.f;
};

struct OptimizerConfig {
  std::string type = "adam";  // --optimizer adam|sgd (adam is AdamW: decoupled weight decay, as Megatron)
  float lr = 1e-4f;
  float weight_decay = 0.01f;
  float adam_beta1 = 0.9f, adam_beta2 = 0.999f, adam_eps = 1e-8f;
  float sgd_momentum = 0.9f;
};

// One state tensor of an optimizer: fp32 values for elements [lo, hi) of the flat buffer it
// steps (its `value` is [hi - lo]), on that buffer's device.
struct StateTensor {
  std::string name;  // exp_avg, exp_avg_sq, momentum_buffer
  int64_t lo = 0, hi = 0;
  Tensor value;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update of `params` from `grads` (fp32 tensors of the buffer's numel, on the device the
  // optimizer was made for) with this step's rates (the schedule's values), writing the compute
  // copy `copy` (ops::HalfCopy; none in fp32 runs) in the same pass.
  virtual void update(Tensor& params, const Tensor& grads, const StepRates& rates, const ops::HalfCopy& copy) = 0;
  // The same with one learning rate for every parameter.
  void step(Tensor& params, const Tensor& grads, double lr, double weight_decay, const ops::HalfCopy& copy) {
    update(params, grads, StepRates{lr, lr, weight_decay}, copy);
  }
  // The state apart from the step count, the one interface checkpoints read and write it through
  // on either device: the optimizer's own tensors, in place, so a write changes the next step. A
  // reader on the host copies them where they live on a device (Tensor::to_device / copy_from),
  // as it does the parameters. Each covered range's tensors in turn, in buffer order.
  virtual std::vector<StateTensor> state() = 0;
  virtual int64_t step_count() const = 0;
  virtual void set_step_count(int64_t n) = 0;
};

// AdamW (optim/adamw.h) or SGD (optim/sgd.h) over a flat buffer of numel on `device` (where the
// params it will step live), its state zeroed there. Spans must not overlap; elements outside
// every span get weight decay and the default learning rate. Throws mt::Error naming the flag for invalid settings
// (--optimizer, --adam-beta1, ...).
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& cfg, int64_t numel, std::vector<ParamSpan> spans,
                                          Device device);

}  // namespace mt::optim
