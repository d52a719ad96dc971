#pragma once
// The output layer and its softmax cross-entropy in one chunked pass (the CPU training head),
// never holding the [tokens, vocab] logits: see output_loss.cpp.
#include <cstdint>

namespace mt::cpu {

template <typename T>
struct OutputLoss {
  const T* x = nullptr;              // [N, H]: the final norm's output
  const T* w = nullptr;              // [V, H]: the output layer (Megatron's [out, in])
  const int32_t* targets = nullptr;  // [N], in [0, V)
  int64_t N = 0, V = 0, H = 0;
  int64_t valid_v = 0;  // columns [valid_v, V) are vocabulary padding: outside the softmax, zero gradient
  // Training: the gradients of sum_i dloss[i] * losses[i]. dx [N, H] is written; dw [V, H]
  // accumulated, or written where !accumulate_dw (the step's first write, as linear_backward's
  // beta = 0). Null dloss: the losses alone (evaluation).
  const T* dloss = nullptr;
  T* dx = nullptr;
  T* dw = nullptr;
  bool accumulate_dw = true;
};

// losses [N] and lse [N] as cross_entropy_forward over x w^T gives them, and with p.dloss the
// gradients that cross_entropy_backward + linear_backward give, equal to them within fp32
// rounding (the summation order differs) and bit-identical for any thread count.
void output_loss(const OutputLoss<float>& p, float* losses, float* lse);
void output_loss(const OutputLoss<double>& p, double* losses, double* lse);

}  // namespace mt::cpu
