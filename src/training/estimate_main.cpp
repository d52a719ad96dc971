// `megatron estimate`: pretrain's flags (parsed and validated by pretrain's own code) plus
// --gpu-memory-gib and --world-size; prints per-rank memory, communication and FLOPs, whether
// the run fits, and layout changes that would make it fit. Touches no GPU and reads no data.
#include <algorithm>
#include <cstdio>
#include <functional>

#include "core/error.h"
#include "core/log.h"
#include "data/tokenizer.h"
#include "training/commands.h"
#include "training/estimate.h"
#include "training/flag_parser.h"

namespace mt::estimate {

Arguments validated(Arguments a, const Options& o, int64_t vocab) {
  // What pretrain needs but an estimate does not: data and a length of training.
  if (a.train_iters <= 0 && a.train_samples <= 0) a.train_iters = 1;
  if (a.data.data_path.empty() && a.data.train_data_path.empty()) a.data.mock = true;
  const bool half = a.model.bf16 || a.model.fp16;
  if (a.device == "auto") a.device = half ? "cuda" : "cpu";
  if (a.device == "cuda" && !half) fail("--device cuda trains in bf16 or fp16: add --bf16 (or --fp16)");
  const int64_t tp = a.tensor_model_parallel_size, pp = a.pipeline_model_parallel_size, cp = a.context_parallel_size;
  for (auto [name, v] : {std::pair{"--tensor-model-parallel-size", tp}, {"--pipeline-model-parallel-size", pp},
                         {"--context-parallel-size", cp}})
    if (v < 1) fail("{} must be at least 1 (got {})", name, v);
  const int64_t mp = tp * pp * cp;  // each at most 2^16: no overflow
  const int64_t world = o.world_size > 0 ? o.world_size : mp;
  if (world % mp != 0)
    fail("--world-size {} is not divisible by --tensor-model-parallel-size ({}) x --pipeline-model-parallel-size ({}) "
         "x --context-parallel-size ({}) = {}; give a multiple of {}",
         world, tp, pp, cp, mp, mp);
  // Context parallelism is not trainable yet, so pretrain's rules refuse it; the estimate models
  // Megatron's (sequence split over CP, ring attention): validate as the CP = 1 run on the
  // CP-fold smaller world, which gives the same data-parallel size.
  if (cp > 1 && a.model.seq_length % (2 * cp) != 0)
    fail("--seq-length {} must be divisible by 2 x --context-parallel-size {} = {} (each context-parallel rank takes "
         "two chunks of the sequence)",
         a.model.seq_length, cp, 2 * cp);
  a.context_parallel_size = 1;
  a.world_size = world / cp;
  validate_args(a, vocab);
  a.context_parallel_size = cp;
  a.world_size = world;
  return a;
}

std::vector<Suggestion> suggestions(const Arguments& parsed, const Options& o, int64_t vocab, double budget) {
  struct Change {
    std::string flags;
    std::function<void(Arguments&)> apply;
  };
  std::vector<Change> changes;
  const Arguments& p = parsed;
  if (!p.use_distributed_optimizer)
    changes.push_back({"--use-distributed-optimizer", [](Arguments& a) { a.use_distributed_optimizer = true; }});
  if (p.tensor_model_parallel_size > 1 && !p.sequence_parallel)
    changes.push_back({"--sequence-parallel", [](Arguments& a) { a.sequence_parallel = true; }});
  if (p.model.recompute_granularity.empty())
    changes.push_back({"--recompute-activations", [](Arguments& a) { a.model.recompute_granularity = "selective"; }});
  if (p.micro_batch_size > 1)
    changes.push_back({"--micro-batch-size " + std::to_string(p.micro_batch_size / 2),
                       [](Arguments& a) { a.micro_batch_size /= 2; }});
  if (p.tensor_model_parallel_size < 8) {
    const int64_t t2 = p.tensor_model_parallel_size * 2;
    changes.push_back({"--tensor-model-parallel-size " + std::to_string(t2) + " --sequence-parallel",
                       [t2](Arguments& a) {
                         a.tensor_model_parallel_size = t2;
                         a.sequence_parallel = true;
                       }});
  }
  const int64_t p2 = p.pipeline_model_parallel_size * 2;
  changes.push_back({"--pipeline-model-parallel-size " + std::to_string(p2), [p2](Arguments& a) {
                       a.pipeline_model_parallel_size = p2;
                       a.decoder_first_pipeline_num_layers = a.decoder_last_pipeline_num_layers = 0;
                     }});
  if (p.model.moe.enabled())
    changes.push_back({"--expert-model-parallel-size " + std::to_string(p.expert_model_parallel_size * 2),
                       [](Arguments& a) { a.expert_model_parallel_size *= 2; }});
  if (!p.model.recompute_full())
    changes.push_back({"--recompute-granularity full --recompute-method uniform --recompute-num-layers 1",
                       [](Arguments& a) {
                         a.model.recompute_granularity = "full";
                         a.model.recompute_method = "uniform";
                         a.model.recompute_num_layers = 1;
                         // insert from an array: GCC 12 misreads push_back of short literals here as an
                         // out-of-bounds copy (-Warray-bounds, a known false positive).
                         static const std::string given[] = {"--recompute-method", "--recompute-num-layers"};
                         a.given.insert(a.given.end(), std::begin(given), std::end(given));
                       }});
  // The needed bytes with `a`, or a negative value where the layout is invalid.
  auto try_args = [&](const Arguments& a) -> double {
    try {
      return estimate(validated(a, o, vocab), o).needed_bytes();
    } catch (const Error&) {
      return -1;
    }
  };
  std::vector<Suggestion> fits;
  for (const Change& c : changes) {
    Arguments a = parsed;
    c.apply(a);
    const double need = try_args(a);
    if (need >= 0 && need <= budget) fits.push_back({c.flags, need, true});
  }
  if (!fits.empty()) {
    if (fits.size() > 4) fits.resize(4);
    return fits;
  }
  // No single change fits: combine them, each round taking the one that saves the most, then
  // drop those the others make unnecessary.
  auto with = [&](const std::vector<size_t>& picked) {
    Arguments a = parsed;
    for (size_t i : picked) changes[i].apply(a);
    return try_args(a);
  };
  auto describe = [&](const std::vector<size_t>& picked, double need) {
    std::string flags;
    for (size_t i : picked) flags += (flags.empty() ? "" : " ") + changes[i].flags;
    return Suggestion{flags, need, need <= budget};
  };
  std::vector<size_t> picked;
  double need = -1;
  while (picked.size() < changes.size() && picked.size() < 6) {
    double best = -1;
    size_t pick = changes.size();
    for (size_t i = 0; i < changes.size(); ++i) {
      if (std::find(picked.begin(), picked.end(), i) != picked.end()) continue;
      std::vector<size_t> trial = picked;
      trial.push_back(i);
      const double n = with(trial);
      if (n >= 0 && (best < 0 || n < best)) best = n, pick = i;
    }
    if (pick == changes.size()) break;
    picked.push_back(pick);
    need = best;
    if (need <= budget) break;
  }
  if (picked.empty()) return {};
  if (need <= budget)
    for (size_t k = 0; k < picked.size() && picked.size() > 1;) {
      std::vector<size_t> fewer = picked;
      fewer.erase(fewer.begin() + static_cast<std::ptrdiff_t>(k));
      const double n = with(fewer);
      if (n >= 0 && n <= budget) picked = fewer, need = n;
      else ++k;
    }
  return {describe(picked, need)};
}

namespace {

int64_t vocabulary(Arguments& a) {
  if (!a.tokenizer.type.empty() && a.tokenizer.type != "NullTokenizer") return data::build_tokenizer(a.tokenizer)->vocab_size();
  if (a.tokenizer.vocab_size <= 0)
    fail("the vocabulary size is needed: give --vocab-size N, or --tokenizer-type with its files (--vocab-file/"
         "--merge-file or --tokenizer-model)");
  if (a.tokenizer.type.empty()) a.tokenizer.type = "NullTokenizer";
  return a.tokenizer.vocab_size;
}

}  // namespace
}  // namespace mt::estimate

namespace mt {

int estimate_main(const std::vector<std::string>& argv) {
  estimate::Options o;
  auto extra = [&o](FlagParser& p) {
    p.custom("--gpu-memory-gib", true,
             [&o](const std::string& v) {
               double g = 0;
               try {
                 size_t used = 0;
                 g = std::stod(v, &used);
                 if (used != v.size()) g = -1;
               } catch (const std::exception&) {
                 g = -1;
               }
               if (!(g > 0 && g <= 1e6))
                 fail("--gpu-memory-gib got '{}'; expected the memory of one GPU in GiB, e.g. 80", v);
               o.gpu_memory_gib = g;
             },
             "memory of one GPU in GiB (default 80, an H100); with --device cpu, of the host");
    p.value("--world-size", &o.world_size, "number of GPUs (ranks); default TP x PP x CP (data-parallel 1)",
            {1, int64_t{1} << 24});
  };
  Arguments a;
  try {
    a = parse_pretrain_args(argv, "estimate", extra);
  } catch (const Error& e) {
    const std::string what = e.what();
    if (what.rfind("help:", 0) == 0) {
      std::printf("megatron estimate: per-rank memory, communication and FLOPs of a pretrain run, from its flags "
                  "(no GPU, no data).\n%s",
                  what.c_str() + 5);
      return 0;
    }
    throw;
  }
  const int64_t vocab = estimate::vocabulary(a);
  set_log_level(LogLevel::Warn);  // validation's notes (e.g. SP without TP) are not the report
  const Arguments v = estimate::validated(a, o, vocab);
  const estimate::Estimate e = estimate::estimate(v, o);
  const double budget = o.gpu_memory_gib * double(1 << 30);
  std::vector<estimate::Suggestion> s;
  if (e.needed_bytes() > budget) s = estimate::suggestions(a, o, vocab, budget);
  std::fputs(estimate::report(v, e, o, s).c_str(), stdout);
  return 0;
}

}  // namespace mt
