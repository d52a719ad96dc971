// `megatron convert`: HuggingFace model directories to native checkpoints and back, and
// Megatron-LM's torch_dist / torch checkpoints to either.
//   megatron convert --from hf --input HF_DIR --output DIR [--target-tensor-parallel-size N]
//                    [--target-pipeline-parallel-size M] [--make-vocab-size-divisible-by 128]
//   megatron convert --from megatron --to hf --input DIR --output HF_DIR [--dtype bf16|fp16|fp32]
//   megatron convert --from megatron-torch-dist|megatron-torch [--to megatron|hf] --input DIR --output DIR
// Native checkpoints reshard on load, so the weights are written once (as one rank would) and
// load under any TP/PP/DP layout; the target sizes are checked against the model (heads, query
// groups, layers) and set the vocabulary padding, a multiple of make-vocab-size-divisible-by x TP.
#include <cstdio>
#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_import.h"
#include "checkpoint/megatron/dcp_writer.h"
#include "checkpoint/megatron/megatron_import.h"
#include "checkpoint/model_args.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/cpu/threads.h"
#include "model/gpt_model.h"
#include "optim/optimizer.h"
#include "training/commands.h"
#include "training/convert.h"
#include "training/hf_tokenizer_files.h"
#include "training/resolved_args.h"
#include "training/flag_parser.h"
#include "training/trainer.h"

namespace fs = std::filesystem;

namespace mt {

namespace {

struct ConvertOptions {
  std::string from, to, input, output, dtype, hf_config_style, hf_arch;
  int64_t tp = 1, pp = 1, divisible_by = 128, seq_length = 0, iteration = -1, max_shard_mb = 5120, threads = 0;
};

int hf_to_native(const ConvertOptions& o) {
  checkpoint::HfSpec spec = checkpoint::read_hf_config(o.input);
  const std::string where = (fs::path(o.input) / "config.json").string();
  Arguments a;
  a.given.clear();
  apply_hf_config(a, spec, where);
  a.make_vocab_size_divisible_by = o.divisible_by;
  a.tensor_model_parallel_size = o.tp;
  a.model.seq_length = o.seq_length > 0 ? o.seq_length : spec.cfg.seq_length;
  a.model.attention_dropout = a.model.hidden_dropout = 0.f;
  // A tokenizer shipped with the model is recorded, so generate and logits find it.
  if (fs::exists(fs::path(o.input) / "tokenizer.json")) {
    a.tokenizer.type = "HuggingFaceTokenizer";
    a.tokenizer.tokenizer_model = fs::absolute(o.input).string();
  } else {
    a.tokenizer.type = "NullTokenizer";
    a.tokenizer.vocab_size = spec.vocab_size;
  }
  apply_hf_vocab(a, spec, 0, where);
  a.model.finalize();
  if (o.tp < 1 || o.pp < 1) fail("--target-tensor-parallel-size and --target-pipeline-parallel-size must be >= 1");
  model::check_tensor_parallel(a.model, o.tp, false);
  if (a.model.num_layers % o.pp != 0)
    fail("--target-pipeline-parallel-size {} does not divide the model's {} layers", o.pp, a.model.num_layers);

  model::GPTModel m(a.model);
  checkpoint::load_hf_weights(o.input, m.params(), m.config());
  checkpoint::TrainingState st;
  st.args = checkpoint::model_args_to_json(a.model, a.tokenizer);
  st.args["hf_architecture"] = spec.arch;
  st.args["hf_config"] = spec.raw;  // token ids and other keys, for the way back
  st.args["tokenizer_files"] = checkpoint::tokenizer_files_json(a.tokenizer);
  st.args["run_args"] = resolved_arguments(a);
  checkpoint::SaveOptions so;
  so.assets = checkpoint::tokenizer_assets(a.tokenizer);  // the checkpoint carries the tokenizer
  checkpoint::save_checkpoint(o.output, st, m.params(), nullptr, so);
  std::printf("converted %s model %s (%lld layers, hidden %lld, vocabulary %lld padded to %lld) to %s\n",
              spec.arch.c_str(), o.input.c_str(), static_cast<long long>(a.model.num_layers),
              static_cast<long long>(a.model.hidden_size), static_cast<long long>(spec.vocab_size),
              static_cast<long long>(a.model.vocab_size), o.output.c_str());
  std::printf("load it with --load %s under any layout (TP %lld x PP %lld checked); add --finetune or --no-load-optim "
              "(it holds no optimizer state)\n",
              o.output.c_str(), static_cast<long long>(o.tp), static_cast<long long>(o.pp));
  return 0;
}

// The iteration --iteration names, else the latest.
int64_t input_iteration(const ConvertOptions& o) {
  if (o.iteration >= 0) return o.iteration;
  auto latest = checkpoint::latest_iteration(o.input);
  if (!latest) fail("--input {}: no latest_checkpointed_iteration.txt (not a checkpoint directory?)", o.input);
  return *latest;
}

// --from megatron-torch-dist / megatron-torch: the input must be that Megatron-LM format.
void check_megatron_input(const ConvertOptions& o) {
  namespace mm = checkpoint::megatron;
  const mm::Format want = o.from == "megatron-torch" ? mm::Format::Torch : mm::Format::TorchDist;
  const std::string dir = checkpoint::iteration_dir(o.input, input_iteration(o));
  const mm::Format got = mm::detect_format(dir);
  if (got != want)
    fail("--from {}: '{}' is {} checkpoint; use --from {}", o.from, dir,
         got == mm::Format::None ? std::string("a native (or no)") : fmt::format("a Megatron-LM {}", mm::format_name(got)),
         got == mm::Format::None ? "megatron" : got == mm::Format::Torch ? "megatron-torch" : "megatron-torch-dist");
}

// A Megatron-LM checkpoint to a native one: weights, Adam state and training state, so training
// resumes from the result as from the original (under any layout).
int megatron_lm_to_native(const ConvertOptions& o) {
  const int64_t it = input_iteration(o);
  const checkpoint::TrainingState meta = checkpoint::read_state(o.input, it);
  Arguments a;
  checkpoint::model_args_from_json(meta.args, a.model, a.tokenizer);
  a.model.attention_dropout = a.model.hidden_dropout = 0.f;
  a.model.finalize();
  model::GPTModel m(a.model);
  auto opt = optim::make_optimizer(optim::OptimizerConfig{}, m.params().main_buffer().numel(), {}, Device::CPU);
  checkpoint::LoadOptions lo;
  lo.load_optim = meta.has_optimizer;
  lo.orig_vocab_size = a.model.orig_vocab_size;
  checkpoint::TrainingState st = checkpoint::load_checkpoint(o.input, it, m.params(), opt.get(), lo);
  checkpoint::save_checkpoint(o.output, st, m.params(), st.has_optimizer ? opt.get() : nullptr);
  std::printf("converted the Megatron-LM %s checkpoint %s (iteration %lld, %s) to %s\n", o.from.c_str() + 9,
              o.input.c_str(), static_cast<long long>(st.iteration),
              st.has_optimizer ? "with its optimizer state" : "weights only", o.output.c_str());
  return 0;
}

// Any checkpoint megatron.cpp reads to a Megatron-LM torch_dist one (single-rank layout, which
// Megatron-LM reshards on load).
int to_torch_dist(const ConvertOptions& o) {
  const int64_t it = input_iteration(o);
  checkpoint::CheckpointReader reader(o.input, it);
  checkpoint::megatron::write_torch_dist(o.output, reader);
  std::printf("wrote iteration %lld of %s as a Megatron-LM torch_dist checkpoint to %s (%s; load it in Megatron-LM "
              "with --ckpt-format torch_dist, without --use-distributed-optimizer)\n",
              static_cast<long long>(reader.state().iteration), o.input.c_str(), o.output.c_str(),
              reader.state().has_optimizer ? "with the optimizer state" : "weights only");
  return 0;
}

int native_to_hf(const ConvertOptions& o) {
  const int64_t it = input_iteration(o);
  checkpoint::CheckpointReader reader(o.input, it);
  Arguments a;
  checkpoint::model_args_from_json(reader.state().args, a.model, a.tokenizer);
  checkpoint::use_saved_tokenizer(checkpoint::iteration_dir(o.input, it), reader.state().args, a.tokenizer);
  checkpoint::HfSpec spec;
  spec.cfg = a.model;
  spec.cfg.finalize();
  spec.vocab_size = a.model.orig_vocab_size;
  const auto& args = reader.state().args;
  spec.arch = !o.hf_arch.empty() ? o.hf_arch : args.value("hf_architecture", checkpoint::infer_hf_arch(spec.cfg));
  if (spec.arch == "mistral" && spec.cfg.qk_layernorm) fail("--hf-architecture mistral: the model has q/k norms (qwen3)");
  if (args.contains("hf_config") && args["hf_config"].is_object()) spec.raw = args["hf_config"];
  checkpoint::HfExportOptions eo;
  bool v5 = false;
  DType dflt = a.model.bf16 ? DType::BF16 : DType::F32;
  if (spec.raw.is_object()) {  // came from HF: keep its dtype and config style unless told otherwise
    checkpoint::HfSpec orig = checkpoint::parse_hf_config(spec.raw, "the recorded config.json");
    dflt = orig.dtype;
    v5 = orig.v5_style;
  }
  eo.dtype = o.dtype.empty() ? dflt : checkpoint::hf_dtype(o.dtype, "--dtype");
  if (!o.hf_config_style.empty()) {
    if (o.hf_config_style != "4" && o.hf_config_style != "5")
      fail("--hf-config-style expects 4 (rope_theta, rope_scaling, torch_dtype) or 5 (rope_parameters, dtype)");
    v5 = o.hf_config_style == "5";
  } else if (!v5 && spec.arch == "qwen2_moe" && !spec.cfg.add_qkv_bias) {
    // transformers 4 gives every Qwen2-MoE a QKV bias; only 5.x reads qkv_bias false.
    log_info("--to hf: writing a transformers 5.x config (qkv_bias false needs it); --hf-config-style 4 refuses");
    v5 = true;
  }
  eo.v5_style = v5;
  if (o.max_shard_mb <= 0) fail("--max-shard-size-mb must be positive");
  eo.max_shard_bytes = o.max_shard_mb << 20;
  checkpoint::write_hf_model(
      o.output, spec, [&](const std::string& n) { return reader.read(n); },
      [&](const std::string& n) { return reader.shape(n); }, eo);
  write_hf_tokenizer_files(o.output, a.tokenizer, spec.raw);
  const std::string which = it == checkpoint::kReleaseIteration ? "the release checkpoint" : fmt::format("iteration {}", it);
  std::printf("exported %s of %s as a %s model (%s) to %s\n", which.c_str(), o.input.c_str(),
              spec.arch.c_str(), checkpoint::hf_dtype_name(eo.dtype).c_str(), o.output.c_str());
  return 0;
}

}  // namespace

int convert_main(const std::vector<std::string>& argv) {
  ConvertOptions o;
  FlagParser p("convert");
  p.value("--from", &o.from, "source format (megatron: megatron.cpp's own; megatron-torch-dist, megatron-torch: Megatron-LM's)",
          {"hf", "megatron", "megatron-torch-dist", "megatron-torch"});
  p.value("--to", &o.to, "target format (default: hf from megatron, megatron from the others)",
          {"hf", "megatron", "megatron-torch-dist"});
  p.value("--input", &o.input, "HuggingFace model directory, or checkpoint directory (as --save wrote it)");
  p.value("--output", &o.output, "directory to write");
  p.value("--target-tensor-parallel-size", &o.tp, "TP size the checkpoint must suit (vocab padding; checked)",
          {1, kMaxParallel});
  p.value("--target-pipeline-parallel-size", &o.pp, "PP size the checkpoint must suit (checked)", {1, kMaxParallel});
  p.value("--make-vocab-size-divisible-by", &o.divisible_by, "vocab padding multiple (default 128)",
          {1, kMaxVocabMultiple});
  p.value("--seq-length", &o.seq_length, "sequence length recorded in the checkpoint (default min(max positions, 4096))",
          {1, model::limits::kSeqLength});
  p.value("--iteration", &o.iteration, "--from megatron: which iteration (default: the latest)", {0, INT64_MAX});
  p.value("--dtype", &o.dtype, "--to hf: weight dtype (default: the original's, else bf16 for --bf16 runs, else fp32)",
          {"fp32", "bf16", "fp16", "float32", "bfloat16", "float16"});
  p.value("--hf-config-style", &o.hf_config_style, "--to hf: config.json in transformers 4.x (4) or 5.x (5) style");
  p.value("--hf-architecture", &o.hf_arch, "--to hf: model_type to write (default: recorded or inferred)",
          {"llama", "mistral", "qwen2", "qwen3", "gpt2", "mixtral", "qwen2_moe", "qwen3_moe"});
  p.value("--max-shard-size-mb", &o.max_shard_mb, "--to hf: split larger models into shards (default 5120)",
          {1, INT64_MAX >> 20});  // bytes = MB << 20
  p.value("--num-threads", &o.threads, "CPU threads (default: all cores)", {0, kMaxThreads});
  p.parse(argv);
  if (p.help_requested()) {
    std::fputs(p.help().c_str(), stdout);
    return 0;
  }
  if (o.from.empty()) fail("--from is required: hf (HuggingFace -> megatron.cpp) or megatron (-> HuggingFace)");
  if (o.to.empty()) o.to = o.from == "megatron" ? "hf" : "megatron";
  if (o.to == o.from) fail("--from and --to are both '{}'; nothing to convert", o.from);
  if (o.input.empty()) fail("--input DIR is required");
  if (o.output.empty()) fail("--output DIR is required");
  // Either direction writes a whole new directory: into an existing checkpoint it would move the
  // tracker back to iteration 0 (and beside its files), into a HuggingFace directory mix shards.
  std::error_code ec;
  const auto out = fs::symlink_status(o.output, ec);
  if (fs::exists(out) && !fs::is_directory(fs::status(o.output, ec)))
    fail("--output '{}' exists and is not a directory; choose a new directory", o.output);
  if (fs::exists(out) && !fs::is_empty(o.output, ec))
    fail("--output '{}' exists and is not empty; choose a new directory", o.output);
  cpu::set_num_threads(static_cast<int>(o.threads));
  if (o.to == "megatron-torch-dist") {
    if (o.from == "hf") fail("--to megatron-torch-dist reads a checkpoint: convert --from hf to megatron first");
    if (o.from != "megatron") check_megatron_input(o);
    return to_torch_dist(o);
  }
  if (o.from == "hf") return hf_to_native(o);
  if (o.from == "megatron") return native_to_hf(o);
  check_megatron_input(o);  // Megatron-LM's checkpoints read like native ones from here on
  return o.to == "hf" ? native_to_hf(o) : megatron_lm_to_native(o);
}

}  // namespace mt
