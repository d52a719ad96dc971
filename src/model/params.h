#pragma once
// All parameters of a model live in one contiguous fp32 "main" buffer with a matching fp32
// main-grad buffer (DESIGN.md), so the optimizer, grad clipping, DDP buckets and the
// distributed optimizer work on flat ranges. With --bf16 a separate "model" buffer holds the
// bf16-rounded copy that forward/backward compute with; otherwise it aliases the main buffer.
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "core/philox.h"
#include "core/tensor.h"
#include "optim/optimizer.h"

namespace mt::model {

enum class Init { Normal, ScaledNormal, Zeros, Ones };

struct Param {
  std::string name;  // Megatron-style name, e.g. decoder.layers.0.self_attention.linear_qkv.weight
  Shape shape;
  Init init = Init::Normal;
  bool weight_decay = true;
  int64_t offset = 0;  // into the flat buffers
  Tensor main;         // fp32 master value
  Tensor grad;         // fp32 main grad (accumulated over micro-batches)
  Tensor value;        // what kernels read: == main (fp32) or its bf16-rounded copy
  int64_t numel() const { return shape_numel(shape); }
};

class ParamStore {
 public:
  // Registers a parameter; allowed only before allocate(). Returned reference stays valid.
  Param& add(const std::string& name, const Shape& shape, Init init, bool weight_decay);
  void allocate(bool bf16_model_copy);
  // Megatron's init: N(0, std) for weights, N(0, std / sqrt(2 * num_layers)) for the output
  // projections of attention and MLP, zeros for biases, ones for norm weights. Each parameter
  // draws from its own Philox stream (seed, index), so init does not depend on creation order
  // of other parameters.
  void initialize(uint64_t seed, float std, int64_t num_layers);
  // Refreshes the compute copy after the optimizer changed the main params.
  void sync_model_from_main();
  void zero_grad();

  int64_t numel() const { return total_; }
  Tensor& main_buffer() { return main_; }
  Tensor& grad_buffer() { return grad_; }
  std::deque<Param>& params() { return params_; }
  const std::deque<Param>& params() const { return params_; }
  Param* find(const std::string& name);
  std::vector<optim::ParamSpan> spans() const;
  bool bf16() const { return bf16_; }

 private:
  std::deque<Param> params_;
  Tensor main_, grad_, model_;
  int64_t total_ = 0;
  bool allocated_ = false;
  bool bf16_ = false;
};

}  // namespace mt::model
