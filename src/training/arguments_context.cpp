// Pretrain's long-sequence section: context parallelism's attention form (--cp-comm-type,
// --hierarchical-context-parallel-sizes) and packed documents (--reset-position-ids,
// --reset-attention-mask; --eod-mask-loss is the data section's).
#include <string>

#include "core/error.h"
#include "training/arguments_sections.h"

namespace mt {

void register_context_flags(FlagParser& p, ContextArgs& a) {
  p.value("--cp-comm-type", &a.cp_comm_type,
          "context-parallel attention: p2p (ring), a2a (Ulysses all-to-all), allgather, a2a+p2p (hierarchical)",
          {"p2p", "a2a", "allgather", "a2a+p2p"});
  p.list("--hierarchical-context-parallel-sizes", &a.hierarchical_cp_sizes,
         "a2a+p2p: the all-to-all size and the ring size, whose product is --context-parallel-size");
  p.store_true("--reset-position-ids", &a.reset_position_ids,
               "positions restart after each end-of-document token inside a sample");
  p.store_true("--reset-attention-mask", &a.reset_attention_mask,
               "tokens never attend across an end-of-document token inside a sample (packed documents)");
}

namespace {
int64_t parse_size(const std::string& s) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size() || v < 1 || v > (int64_t{1} << 20))
    fail("--hierarchical-context-parallel-sizes: '{}' is not a positive size", s);
  return v;
}
}  // namespace

void validate_context_args(Arguments& a) {
  const int64_t cp = a.context_parallel_size;
  const bool hier_given = !a.hierarchical_cp_sizes.empty();
  a.cp_a2a_size = a.cp_comm_type == "a2a" ? cp : 1;
  if (a.cp_comm_type == "a2a+p2p") {
    if (!hier_given)
      fail("--cp-comm-type a2a+p2p needs --hierarchical-context-parallel-sizes A P (all-to-all size, ring size; "
           "A x P = --context-parallel-size {})",
           cp);
    if (a.hierarchical_cp_sizes.size() != 2)
      fail("--hierarchical-context-parallel-sizes takes two sizes (all-to-all, ring), got {}",
           a.hierarchical_cp_sizes.size());
    const int64_t a2a = parse_size(a.hierarchical_cp_sizes[0]), ring = parse_size(a.hierarchical_cp_sizes[1]);
    if (a2a * ring != cp)
      fail("--hierarchical-context-parallel-sizes {} x {} = {} must equal --context-parallel-size {}", a2a, ring,
           a2a * ring, cp);
    a.cp_a2a_size = a2a;
  } else if (hier_given) {
    fail("--hierarchical-context-parallel-sizes applies to --cp-comm-type a2a+p2p only (got --cp-comm-type {})",
         a.cp_comm_type);
  }
  if (cp == 1) return;
  const int64_t seq = a.model.seq_length;
  if (seq > 0 && seq % (2 * cp) != 0)
    fail("--seq-length ({}) must be divisible by 2 x --context-parallel-size = {}: Megatron cuts each sequence into "
         "2 x CP chunks for causal load balancing",
         seq, 2 * cp);
  if (a.sequence_parallel && seq > 0 && (seq / cp) % a.tensor_model_parallel_size != 0)
    fail("--sequence-parallel with --context-parallel-size {}: the {} tokens per CP rank (--seq-length {} / CP) must "
         "be divisible by --tensor-model-parallel-size {}",
         cp, seq / cp, seq, a.tensor_model_parallel_size);
  if (a.cp_a2a_size > 1) {
    const int64_t tp = a.tensor_model_parallel_size, heads = a.model.num_attention_heads;
    const int64_t groups = a.group_query_attention ? a.model.num_query_groups : heads;
    const int64_t local_heads = heads / tp, local_groups = groups >= tp ? groups / tp : 1;
    if (heads > 0 && local_heads % a.cp_a2a_size != 0)
      fail("--cp-comm-type {}: the {} attention heads per tensor-parallel rank must be divisible by the all-to-all "
           "size {} (each rank takes a share of the heads)",
           a.cp_comm_type, local_heads, a.cp_a2a_size);
    if (heads > 0 && local_groups % a.cp_a2a_size != 0)
      fail("--cp-comm-type {}: the {} key/value groups per tensor-parallel rank must be divisible by the all-to-all "
           "size {}; change --num-query-groups or use --cp-comm-type p2p",
           a.cp_comm_type, local_groups, a.cp_a2a_size);
  }
}

}  // namespace mt
