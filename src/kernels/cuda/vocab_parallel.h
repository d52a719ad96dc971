#pragma once
// The GPU side of model/vocab_parallel.cpp: what one tensor-parallel rank computes between the
// TP collectives for the vocab-parallel embedding and cross-entropy, when it holds vocabulary
// rows (embedding) or logit columns (loss) [start, start + vl). Tensors live on the GPU (ids
// and labels I32, statistics f32, activations bf16, fp16 or f32); every call is asynchronous on the
// compute stream, deterministic, and never forms a probability tensor.
#include "core/tensor.h"

namespace mt::ops::gpu {

// ids [n] global token ids, table [vl, h] -> [n, h] in the table's dtype: the table row of each
// id in this rank's range, zeros for the others (the TP sum then completes every row).
Tensor vocab_embedding_forward(const Tensor& ids, const Tensor& table, int64_t start);
// dtable [vl, h] f32 += the rows of dout [n, h] whose ids lie in this rank's range. Each table
// row's contributions are summed in increasing position order: no atomics.
void vocab_embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable, int64_t start);

// Cross-entropy over this rank's logits [n, vl], in three steps around two TP all-reduces:
//  1) the per-row maximum, f32 [n]                                     -> all-reduce Max;
Tensor vocab_ce_row_max(const Tensor& logits);
//  2) per row, f32 [n, 2]: the sum of exp(x - max) over this rank's columns, and the target's
//     logit when labels[r] lies in [start, start + vl), else 0         -> all-reduce Sum;
Tensor vocab_ce_partial_stats(const Tensor& logits, const Tensor& labels, const Tensor& row_max, int64_t start);
//  3) lse = max + log(sum) and losses = lse - target logit, f32 [n] each.
void vocab_ce_finish(const Tensor& row_max, const Tensor& stats, Tensor& losses, Tensor& lse);
// dlogits [n, vl] = dloss * exp(x - lse) - dloss * onehot(labels - start), dloss f32 [n], in the
// logits' dtype. Written over `logits` (they are dead once their gradient exists) and returned.
Tensor vocab_ce_backward(const Tensor& logits, const Tensor& labels, const Tensor& lse, const Tensor& dloss,
                         int64_t start);

}  // namespace mt::ops::gpu
