#pragma once
// Megatron's vocab-parallel embedding and cross-entropy: TP rank r holds rows
// [r*V/tp, (r+1)*V/tp) of the (padded) vocabulary. The embedding looks up the ids in its range
// (zeros elsewhere) and the caller sums over TP; the loss combines per-rank maxima and sums of
// exponentials, so no rank ever holds a full row of logits. fp32 CPU tensors, or GPU tensors
// (bf16 table and logits, fp32 table gradient) whose collectives run on device buffers.
// ids and labels are I32 [n] and dloss F32 [n], on the same device as the table or logits.
#include "core/tensor.h"
#include "model/tensor_parallel.h"

namespace mt::model {

// ids: [n] global token ids; table: this rank's [V/tp, h] rows. Returns partial rows [n, h].
Tensor vocab_parallel_embedding_forward(const Tensor& ids, const Tensor& table, const TensorParallel& tp);
// dtable[id - start] += dout[i] for the ids in this rank's range, in increasing i.
void vocab_parallel_embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable, const TensorParallel& tp);

// logits: this rank's [n, V/tp] columns; labels global ids. Writes losses [n] and the global
// log-sum-exp [n] (f32), identical on every TP rank.
void vocab_parallel_cross_entropy_forward(const Tensor& logits, const Tensor& labels, const TensorParallel& tp,
                                          Tensor& losses, Tensor& lse);
// dlogits [n, V/tp] = dloss * (softmax - onehot) on this rank's columns. On the GPU the
// gradient is written over `logits` (dead after this) and returned.
Tensor vocab_parallel_cross_entropy_backward(const Tensor& logits, const Tensor& labels, const Tensor& lse,
                                             const Tensor& dloss, const TensorParallel& tp);

}  // namespace mt::model
