#include "training/inference_load.h"

#include <filesystem>
#include <fstream>
#include <optional>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_import.h"
#include "checkpoint/model_args.h"
#include "core/error.h"
#include "core/error_report.h"
#include "core/log.h"
#include "model/fp8_inference.h"
#include "training/convert.h"
#include "training/hf_tokenizer_files.h"
#include "training/memory_check.h"

namespace mt {

namespace {

// FP8 inference's settings: E4M3 operands with current (tensorwise) scaling, the weights' scales
// fixed at load. A checkpoint trained in FP8 holds its scaling state (its saved arguments do not
// name --fp8-format); its layers kept in bf16 there (--first-last-layers-bf16) stay bf16 here.
model::Fp8Config fp8_inference_config(const nlohmann::json& ckpt_args, bool trained_fp8) {
  model::Fp8Config f;
  f.enabled = true;
  f.recipe = model::Fp8Recipe::Tensorwise;
  if (!trained_fp8) return f;
  const nlohmann::json* run = ckpt_args.contains("run_args") ? &ckpt_args["run_args"] : nullptr;
  const nlohmann::json* a = run && run->is_object() && run->contains("arguments") ? &(*run)["arguments"] : nullptr;
  if (a && a->is_object()) {
    auto num = [&](const char* k, int64_t d) {
      return a->contains(k) && (*a)[k].is_number_integer() ? (*a)[k].get<int64_t>() : d;
    };
    f.first_last_layers_bf16 = a->contains("first_last_layers_bf16") && (*a)["first_last_layers_bf16"].is_boolean() &&
                               (*a)["first_last_layers_bf16"].get<bool>();
    f.num_layers_at_start_in_bf16 = num("num_layers_at_start_in_bf16", 1);
    f.num_layers_at_end_in_bf16 = num("num_layers_at_end_in_bf16", 1);
  }
  log_info("the checkpoint was trained with FP8 (it holds FP8 scaling state); its weights are quantised at load{}",
           f.first_last_layers_bf16 ? ", its first and last layers kept in bf16 as in training" : "");
  return f;
}

}  // namespace

InferenceModel load_inference_model(const std::string& load, int64_t iteration, Device device, bool need_tokenizer,
                                    comm::Communicator* tp, bool fp8_weights) {
  const int tp_size = tp ? tp->size() : 1;
  const auto kind = checkpoint::detect_checkpoint(load);
  if (kind == checkpoint::CheckpointKind::Empty)
    fail("--load '{}' holds neither a checkpoint (latest_checkpointed_iteration.txt) nor a HuggingFace model "
         "(config.json + safetensors)",
         load);
  const bool hf = kind == checkpoint::CheckpointKind::HuggingFace;
  if (hf && tp_size > 1)
    fail("--tensor-model-parallel-size {} reads native checkpoints: convert the HuggingFace model first (megatron "
         "convert --from hf --input {} --output DIR), then --load DIR",
         tp_size, load);
  InferenceModel r;
  Arguments& a = r.args;
  bool have_tokenizer = true;
  nlohmann::json ckpt_args = nlohmann::json::object();
  bool trained_fp8 = false;  // the checkpoint holds FP8 scaling state (pretrain --fp8-format saved it)
  if (hf) {
    if (iteration >= 0) fail("--iteration {}: --load '{}' is a HuggingFace model, which has no iterations", iteration, load);
    const checkpoint::HfSpec spec = checkpoint::read_hf_config(load);
    apply_hf_config(a, spec, (std::filesystem::path(load) / "config.json").string());
    apply_hf_vocab(a, spec, 0, load);
    a.model.seq_length = spec.cfg.seq_length;  // the context: min(max positions, 4096), as convert records
    have_tokenizer = tokenizer_of_hf_dir(load, a.tokenizer);
    if (!have_tokenizer && need_tokenizer)
      fail("--load {}: a HuggingFace model without tokenizer files (tokenizer.json, vocab.json + merges.txt, or "
           "tokenizer.model); copy its tokenizer into the directory",
           load);
  } else {
    if (iteration < 0) {
      const std::optional<int64_t> latest = checkpoint::latest_iteration(load);
      if (!latest) fail("--load {}: no latest_checkpointed_iteration.txt (not a checkpoint directory)", load);
      iteration = *latest;
    } else if (!std::filesystem::is_directory(checkpoint::iteration_dir(load, iteration))) {
      fail("--iteration {}: '{}' holds no such iteration (no {})", iteration, load,
           checkpoint::iteration_dir(load, iteration));
    }
    auto st = checkpoint::read_state(load, iteration);
    ckpt_args = st.args;
    {  // its metadata.json's "fp8" (the delayed recipe's histories, or an empty object)
      std::ifstream md(std::filesystem::path(checkpoint::iteration_dir(load, iteration)) / "metadata.json");
      const nlohmann::json j = nlohmann::json::parse(md, nullptr, false);
      trained_fp8 = j.is_object() && j.contains("fp8") && !j["fp8"].is_null();
    }
    checkpoint::model_args_from_json(st.args, a.model, a.tokenizer);
    checkpoint::use_saved_tokenizer(checkpoint::iteration_dir(load, iteration), st.args, a.tokenizer);
  }
  a.model.attention_dropout = a.model.hidden_dropout = 0.f;
  // fp32 on the CPU (the reference); bf16 compute copy on the GPU.
  a.model.bf16 = device == Device::CUDA;
  a.model.fp16 = false;
  a.model.fp8 = fp8_weights ? fp8_inference_config(ckpt_args, trained_fp8) : model::Fp8Config{};
  a.model.recompute_granularity.clear();
  a.model.recompute_method.clear();
  a.model.recompute_num_layers = 0;
  a.model.finalize();
  if (tp_size > 1) model::check_tensor_parallel(a.model, tp_size, false);
  if (device == Device::CPU)
    check_host_memory(a.model, 4, 1, 0, "its fp32 parameters");
  if (have_tokenizer) r.tokenizer = data::build_tokenizer(a.tokenizer);
  Activity building("building the model");
  model::ModelOptions mo;
  if (tp_size > 1) mo.tp = tp;
  r.model = std::make_unique<model::GPTModel>(a.model, mo);
  if (hf) {
    checkpoint::load_hf_weights(load, r.model->params(), r.model->config());
  } else {
    checkpoint::LoadOptions lo;
    lo.load_optim = false;
    lo.load_rng = false;
    checkpoint::RankInfo ri;
    if (tp_size > 1) {
      ri.rank = ri.tp_rank = tp->rank();
      ri.world = ri.tp = tp_size;
      ri.comm = tp;
    }
    checkpoint::load_checkpoint(load, iteration, ri, r.model->params(), nullptr, lo);
  }
  if (a.model.bf16) r.model->params().sync_model_from_main();
  if (device == Device::CUDA) r.model->to_device(Device::CUDA);
  if (fp8_weights) {
    const model::Fp8WeightMemory mem = model::freeze_fp8_weights(*r.model);
    log_info("{}", mem.describe());
  }
  return r;
}

void open_inference_ranks(InferenceRanks& ranks, const comm::DistEnv& env, const std::string& device, int64_t tp,
                          std::chrono::milliseconds timeout) {
  comm::DeviceComm dc;
  if (device == "cuda") {
    if (env.local_world_size > ops::gpu_count())
      fail("--device cuda: {} ranks on this node but {} GPU(s) visible", env.local_world_size, ops::gpu_count());
    ranks.gpu.emplace(env.local_rank);
    dc = comm::DeviceComm{env.world_size > 1, ranks.gpu->compute_stream(), env.local_rank};
  }
  if (tp > 1) ranks.world.emplace(env, timeout, dc);
}

}  // namespace mt
