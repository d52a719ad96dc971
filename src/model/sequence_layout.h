#pragma once
// Where one micro-batch pass's tokens sit in their sequences, for the layers that care
// (attention and the position embeddings): this rank's part of each sequence under context
// parallelism, the position of every token (Megatron's position_ids: they restart after each
// end-of-document token with --reset-position-ids), and the documents attention keeps apart
// (--reset-attention-mask) as cumulative lengths, never as an S x S mask. GPTModel builds one
// per micro-batch; the attention layers keep it with their saved state for backward.
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "model/context_parallel.h"

namespace mt::model {

struct SequenceLayout {
  int64_t B = 0;
  int64_t S = 0;        // the whole sequence (the batch's)
  int64_t S_local = 0;  // this rank's tokens per sample: S / CP
  // Documents over the batch's B * S positions, sample after sample (AttentionShape's
  // cu_seqlens): on the model's device, and on the host. Empty: one document per sample.
  Tensor cu_seqlens;
  std::vector<int32_t> cu_host;
  // RoPE tables for this rank's tokens: [S_local, rot/2], or [B, S_local, rot/2] when positions
  // differ between samples. Undefined: the model's tables.
  Tensor rope_cos, rope_sin;
  // Learned position embeddings: the position of each of this rank's rows [S_local * B] in the
  // model's (s, b) order. Undefined: row s has position s.
  Tensor position_ids;
  const ContextParallel* cp = nullptr;  // set when CP > 1
  // Fills an attention call's whole-sequence fields (seq_total and the documents).
  void describe(ops::AttentionShape& p) const {
    p.seq_total = S;
    if (!cu_host.empty()) {
      p.cu_seqlens = cu_seqlens.data<int32_t>();
      p.num_segments = static_cast<int64_t>(cu_host.size()) - 1;
      p.cu_seqlens_host = cu_host.data();
    }
  }
};

}  // namespace mt::model
