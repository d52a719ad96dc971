// The communication half of `megatron estimate`: bytes one rank sends per training step in each
// of its groups, counting a ring collective over n ranks of a [total] buffer as Megatron's
// bandwidth arithmetic does: all-reduce 2(n-1)/n x total, all-gather and reduce-scatter
// (n-1)/n x total, point-to-point the message itself. The busiest pipeline rank is reported
// (the one holding the most layers; the embedding's and head's collectives are added where
// that rank holds them).
#include <algorithm>

#include "parallel/pipeline_layout.h"
#include "training/estimate.h"

namespace mt::estimate {
namespace {

double ring(int64_t n) { return n > 1 ? static_cast<double>(n - 1) / static_cast<double>(n) : 0.0; }

}  // namespace

std::vector<CommVolume> comm_volumes(const Arguments& a, const Estimate& e) {
  const auto& c = a.model;
  const double elem = e.gpu ? 2.0 : 4.0;  // activations travel in the compute dtype
  const double M = static_cast<double>(e.microbatches);
  const double t = static_cast<double>(a.micro_batch_size) * static_cast<double>(c.seq_length) /
                   static_cast<double>(e.cp);
  const double h = static_cast<double>(c.hidden_size);
  const double act = t * h * elem;  // one [tokens, hidden] activation of a micro-batch (unsharded)
  // The rank with the most layers.
  const StageMemory* busiest = &e.stages.front();
  for (const StageMemory& s : e.stages)
    if (s.layers > busiest->layers) busiest = &s;
  const double L = static_cast<double>(busiest->layers);
  int64_t moe_layers = 0;
  const parallel::PipelineLayout layout(c.num_layers, pipeline_options(a));
  for (auto [b, en] : layout.chunks(busiest->rank))
    for (int64_t l = b; l < en; ++l) moe_layers += c.moe.is_moe_layer(l) ? 1 : 0;
  const double Lm = static_cast<double>(moe_layers);
  // Full recomputation runs each recomputed layer's forward (and its collectives) twice.
  double forwards = 1.0;
  if (c.recompute_full())
    forwards += c.recompute_method == "uniform"
                    ? 1.0
                    : std::min(1.0, static_cast<double>(c.recompute_num_layers) / std::max(1.0, L));

  std::vector<CommVolume> out;
  if (e.tp > 1) {
    CommVolume v{"TP", "", 0, e.tp};
    const double r = ring(e.tp);
    if (a.sequence_parallel) {
      // Per layer: forward all-gathers before linear_qkv and linear_fc1, reduce-scatters after
      // linear_proj and linear_fc2; backward re-gathers the two inputs, gathers the two output
      // gradients and reduce-scatters the two input gradients.
      // MoE layers' MLPs route sequence shards to experts: no TP collective there (their
      // expert-TP and EP traffic is the EP row below), so they count the attention half.
      v.what = "sequence parallel: all-gather + reduce-scatter of [tokens, hidden] per linear pair";
      double per_mb = ((L - Lm) * (4 * forwards + 6) + Lm * (2 * forwards + 3)) * act * r;
      if (busiest->embedding) per_mb += act * r;      // the embedding's reduce-scatter
      if (busiest->head) per_mb += 3 * act * r;       // the head's gather, re-gather, reduce-scatter
      v.bytes = M * per_mb;
    } else {
      v.what = "all-reduce of [tokens, hidden]: 2 per layer forward, 2 backward";
      double per_mb = ((L - Lm) * (2 * forwards + 2) + Lm * (forwards + 1)) * act * 2 * r;
      if (busiest->embedding) per_mb += act * 2 * r;
      if (busiest->head) per_mb += act * 2 * r;
      v.bytes = M * per_mb;
    }
    if (c.num_query_groups < e.tp)  // key/value replication gathers the whole QKV output
      v.bytes += M * L * t * static_cast<double>(c.qkv_out()) * elem * r * (forwards + 1);
    out.push_back(v);
  }
  if (e.cp > 1) {
    // Megatron's ring attention: each layer passes its K/V chunk around the ring in forward, and
    // K/V plus their gradients in backward.
    const double kv = t * 2 * static_cast<double>(c.num_query_groups) * static_cast<double>(c.kv_channels) /
                      static_cast<double>(std::min<int64_t>(e.tp, c.num_query_groups)) * elem;
    out.push_back({"CP", "ring attention: K/V chunks around the ring (forward), K/V and dK/dV (backward)",
                   M * L * kv * static_cast<double>(e.cp - 1) * (forwards + 2), e.cp});
  }
  if (e.pp > 1) {
    // A pass sends its output to the next virtual stage and its input gradient to the previous
    // one, as [tokens / TP under SP, hidden].
    const double msg = (a.sequence_parallel ? act / static_cast<double>(e.tp) : act);
    const double chunks = static_cast<double>(e.vpp);
    const double sends = 2 * chunks - (busiest->embedding ? 1 : 0) - (busiest->head ? 1 : 0);
    out.push_back({"PP", "point-to-point activations (forward) and their gradients (backward)",
                   M * sends * msg, e.pp});
  }
  const double dense = static_cast<double>(busiest->params - busiest->expert_params) * 4.0;  // fp32 grads
  const int64_t dp_group = e.dp * e.cp;
  if (dp_group > 1) {
    if (a.use_distributed_optimizer)
      out.push_back({"DP", "distributed optimizer: reduce-scatter fp32 grads, all-gather fp32 params",
                     2 * dense * ring(dp_group), dp_group});
    else
      out.push_back({"DP", "all-reduce of the fp32 grads", 2 * dense * ring(dp_group), dp_group});
  }
  if (c.moe.enabled()) {
    const double experts = static_cast<double>(busiest->expert_params) * 4.0;
    if (e.edp > 1)
      out.push_back({"expert-DP",
                     a.use_distributed_optimizer ? "expert grads: reduce-scatter, params: all-gather"
                                                 : "all-reduce of the experts' fp32 grads",
                     2 * experts * ring(e.edp), e.edp});
    const int64_t group = e.ep * e.etp;
    if (group > 1) {
      const double tsp = a.sequence_parallel ? t / static_cast<double>(e.tp) : t;
      const double k = static_cast<double>(c.moe.topk);
      double per_layer;
      std::string what;
      if (c.moe.token_dispatcher == "alltoall") {
        // Dispatch and combine all-to-alls, forward and backward: the routed rows leave for
        // other EP ranks with probability (EP-1)/EP under balanced routing.
        what = "all-to-all of the routed rows: dispatch + combine, forward and backward";
        per_layer = 4 * tsp * k * h * elem * ring(e.ep) + (e.etp > 1 ? 4 * tsp * k * h * elem * ring(e.etp) : 0);
      } else {
        what = "all-gather of the tokens and reduce-scatter of the outputs, forward and backward";
        per_layer = 4 * tsp * static_cast<double>(group) * h * elem * ring(group);
      }
      out.push_back({"EP", what, M * Lm * per_layer * forwards, group});
    }
  }
  return out;
}

}  // namespace mt::estimate
