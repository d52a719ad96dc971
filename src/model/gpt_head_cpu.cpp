// The CPU's output layer and loss in one chunked pass (kernels/cpu/output_loss.cpp): the
// [tokens, vocab] logits never exist, and in training the forward also forms the gradients
// (the pipeline passes the backward's loss scale to the forward, PassContext::loss_grad_scale),
// as the GPU's fused cross-entropy does: the output weight's gradient is accumulated here, the
// final norm output's gradient kept for head_backward.
#include "core/error.h"
#include "kernels/cpu/output_loss.h"
#include "kernels/ops.h"
#include "model/gpt_model.h"

namespace mt::model {

// Passes that know the backward's loss scale (the pipeline's training passes). Any other forward
// may be followed by a backward (a gradient check runs one after an evaluation-mode forward),
// which needs the logits: those keep the unfused path, as does fp16, which rounds the logits'
// gradient to fp16 between the two GEMMs.
bool GPTModel::fused_cpu_head(const PassContext& ctx) const {
  return device_ == Device::CPU && !tp_.on() && !cfg_.fp16 && ctx.loss_grad_scale.has_value();
}

LossSums GPTModel::head_forward_cpu(Saved& s, PassContext& ctx) {
  const int64_t n = s.B * s.S, h = cfg_.hidden_size, v = output_->value.dim(0);
  ctx.before_use(output_);
  s.labels = ops::upload(s.labels_sb.data(), {n}, DType::I32, Device::CPU);
  s.mask = ops::upload(s.mask_sb.data(), {n}, DType::F32, Device::CPU);
  Tensor losses = Tensor::empty({n});
  s.lse = Tensor::empty({n});
  cpu::OutputLoss<float> p;
  p.x = s.final_x.data<float>();
  p.w = output_->value.data<float>();
  p.targets = s.labels.data<int32_t>();
  p.N = n;
  p.V = p.valid_v = v;  // the padded vocabulary is in the softmax, as in Megatron
  p.H = h;
  Tensor dloss;
  if (ctx.loss_grad_scale) {  // always, today (fused_cpu_head); the kernel also gives the loss alone
    s.grad_scale = *ctx.loss_grad_scale;
    dloss = ops::scaled_mask(s.mask, s.grad_scale);
    s.head_dx = Tensor::empty({n, h});
    p.dloss = dloss.data<float>();
    p.dx = s.head_dx.data<float>();
    p.dw = output_->grad.data<float>();
    p.accumulate_dw = output_->take_accumulate();
  }
  {
    ScopedOpTimer t(ctx.times, &OpTimes::gemm);  // mostly the output layer's three GEMMs
    cpu::output_loss(p, losses.data<float>(), s.lse.data<float>());
  }
  s.final_x = Tensor();
  return loss_sums(losses, s);
}

}  // namespace mt::model
