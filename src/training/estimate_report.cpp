// What `megatron estimate` prints: the layout, a per-stage memory table, communication per group,
// FLOPs, whether it fits, and the layout changes that would make it fit.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <functional>

#include "training/estimate.h"
#include "training/flops.h"

namespace mt::estimate {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string gib(double bytes) { return fmt::format("{:.2f}", bytes / kGiB); }

// The stages shown: all of them up to 4, else the first two and the last two (the middle ones
// hold what stage 1 holds).
std::vector<const StageMemory*> shown(const Estimate& e) {
  std::vector<const StageMemory*> v;
  const size_t n = e.stages.size();
  for (size_t i = 0; i < n; ++i)
    if (n <= 4 || i < 2 || i + 2 >= n) v.push_back(&e.stages[i]);
  return v;
}

std::string count(double n) { return n < 1e9 ? fmt::format("{:.1f} M", n / 1e6) : fmt::format("{:.3f} B", n / 1e9); }

std::string describe_recompute(const Arguments& a) {
  const auto& m = a.model;
  if (m.recompute_full())
    return fmt::format("full ({}, {} layer{})", m.recompute_method, m.recompute_num_layers,
                       m.recompute_num_layers == 1 ? "" : "s");
  if (m.recompute_selective()) return fmt::format("selective ({})", fmt::join(m.recompute_modules, ", "));
  return "none";
}

// The FP8 settings as the memory rows depend on them, e.g. "hybrid, tensorwise scaling, layers
// 2-31 of 32 (the first and last in bf16), weights all-gathered as FP8 codes".
std::string describe_fp8(const Arguments& a) {
  const model::Fp8Config& f = a.model.fp8;
  const int64_t L = a.model.num_layers;
  int64_t first = -1, last = -1;
  for (int64_t l = 0; l < L; ++l)
    if (f.layer_in_fp8(l, L)) {
      if (first < 0) first = l;
      last = l;
    }
  std::string layers = first < 0 ? "no layer" : fmt::format("layers {}-{} of {}", first + 1, last + 1, L);
  if (first >= 0 && (first > 0 || last < L - 1)) layers += " (the others in bf16)";
  return fmt::format("{}, {} scaling, {}{}{}", f.hybrid ? "hybrid (E4M3 forward, E5M2 gradients)" : "e4m3",
                     model::fp8_recipe_name(f.recipe), layers, f.wgrad ? "" : ", bf16 weight gradients",
                     f.param_gather ? ", weights all-gathered as FP8 codes" : "");
}

}  // namespace

std::string report(const Arguments& a, const Estimate& e, const Options& o, const std::vector<Suggestion>& sugg) {
  const auto& m = a.model;
  std::string r;
  auto line = [&r](const std::string& s) { r += s + "\n"; };
  const char* prec = m.bf16 ? "bf16" : m.fp16 ? "fp16" : "fp32";
  line(fmt::format("megatron estimate: {} layers, hidden {}, {} parameters{} (vocabulary {} padded to {}), {} on {}",
                   m.num_layers, m.hidden_size, count(static_cast<double>(m.num_parameters())),
                   m.moe.enabled() ? fmt::format(" ({} active)", count(static_cast<double>(m.num_active_parameters())))
                                   : std::string(),
                   m.orig_vocab_size, m.vocab_size, prec, e.gpu ? "GPUs" : "the CPU"));
  std::string layout = fmt::format("{} {} = TP {} x CP {} x DP {} x PP {}", e.world_size, e.gpu ? "GPUs" : "ranks",
                                   e.tp, e.cp, e.dp, e.pp);
  if (e.vpp > 1) layout += fmt::format(" ({} virtual stages per rank, interleaved)", e.vpp);
  if (a.sequence_parallel) layout += ", sequence parallel";
  if (m.moe.enabled())
    layout += fmt::format("; experts: EP {} x expert-TP {} x expert-DP {}", e.ep, e.etp, e.edp);
  line("layout: " + layout);
  line(fmt::format("batch: micro-batch {} x sequence {}, global batch {}: {} micro-batch{} per step per data-parallel "
                   "rank | recompute: {} | optimizer: {}{}",
                   a.micro_batch_size, m.seq_length, a.global_batch_size, e.microbatches, e.microbatches == 1 ? "" : "es",
                   describe_recompute(a),
                   a.optimizer.type, a.use_distributed_optimizer ? " (distributed)" : ""));
  if (m.fp8.enabled) line("fp8: " + describe_fp8(a));
  if (e.cp > 1)
    line("note: pretrain does not train with --context-parallel-size > 1 yet; this models Megatron's ring attention");

  const auto stages = shown(e);
  std::string head = fmt::format("\n{:<34}", e.gpu ? "memory per GPU (GiB)" : "memory per rank (GiB)");
  for (const StageMemory* s : stages) head += fmt::format("{:>12}", fmt::format("stage {}", s->rank));
  line(head);
  auto row = [&](const std::string& label, const std::function<std::string(const StageMemory&)>& f) {
    std::string l = fmt::format("  {:<32}", label);
    for (const StageMemory* s : stages) l += fmt::format("{:>12}", f(*s));
    line(l);
  };
  row("layers", [](const StageMemory& s) {
    return fmt::format("{}{}{}", s.layers, s.embedding ? "+emb" : "", s.head ? "+head" : "");
  });
  row("parameters (millions)", [](const StageMemory& s) { return fmt::format("{:.1f}", s.params / 1e6); });
  if (m.bf16 || m.fp16)
    row(fmt::format("weights ({} copy)", prec), [](const StageMemory& s) { return gib(s.weights); });
  row("main params (fp32)", [](const StageMemory& s) { return gib(s.main_params); });
  row("grads (fp32 main grads)", [](const StageMemory& s) { return gib(s.grads); });
  row(a.use_distributed_optimizer ? "optimizer (sharded over DP)" : "optimizer state",
      [](const StageMemory& s) { return gib(s.optimizer); });
  const bool fp8 = m.fp8.enabled;
  if (fp8) {
    row(a.model.fp8.param_gather ? "FP8 weight codes (gathered)" : "FP8 weight codes (per step)",
        [](const StageMemory& s) { return gib(s.fp8_weights); });
    if (std::any_of(e.stages.begin(), e.stages.end(), [](const StageMemory& s) { return s.fp8_emulated_weights > 0; }))
      row("FP8 emulated weights", [](const StageMemory& s) { return gib(s.fp8_emulated_weights); });
    row("FP8 scaling state (MiB)",
        [](const StageMemory& s) { return fmt::format("{:.1f}", s.fp8_state / (1 << 20)); });
  }
  row("activations", [](const StageMemory& s) { return gib(s.activations); });
  row("  passes in flight at the peak", [](const StageMemory& s) { return fmt::format("{}", s.in_flight); });
  row("  one layer, one micro-batch (MiB)",
      [](const StageMemory& s) { return fmt::format("{:.0f}", s.layer_activation / (1 << 20)); });
  if (fp8) {
    row("  FP8 input codes (x^T)", [](const StageMemory& s) { return gib(s.fp8_input_codes); });
    row(fmt::format("  {} inputs not kept", prec), [](const StageMemory& s) {
      return gib(s.fp8_inputs_dropped > 0 ? -s.fp8_inputs_dropped : 0.0);  // no "-0.00"
    });
  }
  row("logits and head", [](const StageMemory& s) { return gib(s.logits); });
  row("backward workspace", [](const StageMemory& s) { return gib(s.workspace); });
  if (fp8) row("  of which FP8 casts", [](const StageMemory& s) { return gib(s.fp8_backward); });
  row(e.gpu ? "= tensor pool peak (*)" : "= tensors at the peak", [](const StageMemory& s) { return gib(s.pool_peak()); });
  row(e.gpu ? "+ allocator slack (5%)" : "+ heap slack (10% of activations)",
      [&e](const StageMemory& s) { return gib(e.slack(s)); });
  row(e.gpu ? "+ CUDA context, libraries, NCCL" : "+ the process (binary, libraries)",
      [&e](const StageMemory&) { return gib(e.outside_pool); });
  if (e.attention_workspace > 0)
    row("+ cuDNN attention backward workspace", [&e](const StageMemory&) { return gib(e.attention_workspace); });
  if (e.fp8_gemm_workspace > 0)
    row("+ cuBLASLt FP8 workspace", [&e](const StageMemory&) { return gib(e.fp8_gemm_workspace); });
  row("= needed", [&e](const StageMemory& s) { return gib(e.needed(s)); });
  if (e.stages.size() > stages.size())
    line(fmt::format("  (stages 2-{} hold what stage 1 holds, give or take their layer counts)", e.stages.size() - 3));
  if (e.gpu) line("  (*) what pretrain's \"peak GPU memory\" line reports (rank 0's)");

  line(fmt::format("\ncommunication per step, bytes each rank sends (stage {}, the one with most layers):",
                   [&e] {
                     const StageMemory* b = &e.stages.front();
                     for (const StageMemory& s : e.stages)
                       if (s.layers > b->layers) b = &s;
                     return b->rank;
                   }()));
  if (e.comm.empty()) line("  none (one rank)");
  for (const CommVolume& c : e.comm)
    line(fmt::format("  {:<10} {:>4} ranks {:>10} GiB  {}", c.group, c.size, gib(c.bytes), c.what));

  const double flops = flops_per_iteration(m, a.global_batch_size, m.seq_length);
  line(fmt::format("\nFLOPs per step: {:.3g} PFLOP (Megatron's formula, causal attention counted half), {:.3g} "
                   "PFLOP per {}; at 40% of an H100's 989 TFLOP/s: {:.2f} s per step",
                   flops / 1e15, flops / static_cast<double>(e.world_size) / 1e15, e.gpu ? "GPU" : "rank",
                   flops / static_cast<double>(e.world_size) / (0.4 * 989e12)));

  const double budget = o.gpu_memory_gib * kGiB, need = e.needed_bytes();
  const bool fits = need <= budget;
  line(fmt::format("\n{}: {} GiB{} needed on the busiest {} (stage {}) of {} GiB (--gpu-memory-gib){}",
                   fits ? "fits" : "DOES NOT FIT", gib(need),
                   need < 10 * kGiB ? fmt::format(" ({:.0f} MiB)", need / (1 << 20)) : std::string(), e.gpu ? "GPU" : "rank", e.peak_stage().rank,
                   o.gpu_memory_gib, fits ? fmt::format(", {:.0f}% used", 100 * need / budget) : std::string()));
  if (!fits) {
    if (sugg.empty()) line("  no layout change found that fits: more GPUs (--world-size) or a smaller model");
    for (const Suggestion& s : sugg)
      line(fmt::format("  {} {}: {} GiB", s.fits ? "fits with" : "still short with", s.change, gib(s.needed)));
  }
  return r;
}

}  // namespace mt::estimate
