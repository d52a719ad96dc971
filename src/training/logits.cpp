// `megatron logits --load DIR_OR_HF_DIR --input-ids IDS.npy --output LOGITS.npy`: one forward pass
// in fp32 on int64 (or int32) token ids [B, T]; writes float32 logits [B, T, V] over the real
// vocabulary (padding rows dropped). For parity checks against other implementations.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_import.h"
#include "checkpoint/model_args.h"
#include "core/checked.h"
#include "core/error.h"
#include "core/error_report.h"
#include "data/numpy_npy.h"
#include "kernels/cpu/threads.h"
#include "model/gpt_model.h"
#include "training/commands.h"
#include "training/convert.h"
#include "training/flag_parser.h"
#include "training/memory_check.h"
#include "training/trainer.h"

namespace fs = std::filesystem;

namespace mt {

namespace {

// numpy .npy version 1.0, little-endian float32, C order.
void write_npy_f32(const std::string& path, const std::vector<int64_t>& shape, const float* data) {
  std::string dims;
  for (size_t i = 0; i < shape.size(); ++i) dims += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  const size_t unpadded = 10 + header.size() + 1;  // magic(6) + version(2) + length(2) + header + '\n'
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) fail("--output: cannot write '{}'", path);
  const uint16_t len = static_cast<uint16_t>(header.size());
  f.write("\x93NUMPY\x01\x00", 8);
  f.write(reinterpret_cast<const char*>(&len), 2);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n * 4));
  if (!f) fail("--output: writing '{}' failed (disk full?)", path);
}

}  // namespace

int logits_main(const std::vector<std::string>& argv) {
  std::string load, ids_path, out_path;
  int64_t iteration = -1, threads = 0;
  FlagParser p("logits");
  p.value("--load", &load, "checkpoint directory (as --save wrote it) or HuggingFace model directory");
  p.value("--input-ids", &ids_path, ".npy of int64 (or int32) token ids, shape [B, T]");
  p.value("--output", &out_path, ".npy to write: float32 logits [B, T, vocab]");
  p.value("--iteration", &iteration, "which saved iteration (default: the latest)", {0, INT64_MAX});
  p.value("--num-threads", &threads, "CPU threads (default: all cores)", {0, kMaxThreads});
  p.parse(argv);
  if (p.help_requested()) {
    std::fputs(p.help().c_str(), stdout);
    return 0;
  }
  if (load.empty()) fail("--load DIR is required");
  if (ids_path.empty()) fail("--input-ids IDS.npy is required");
  if (out_path.empty()) fail("--output LOGITS.npy is required");
  cpu::set_num_threads(static_cast<int>(threads));

  std::optional<Activity> reading(std::in_place, "reading --input-ids");
  data::NpyArray ids = data::NpyArray::load(ids_path);
  reading.reset();
  if (ids.shape().size() != 2 || ids.shape()[0] < 1 || ids.shape()[1] < 1)
    fail("--input-ids '{}' has shape {}; expected [batch, tokens]", ids_path, shape_to_string(ids.shape()));
  const int64_t B = ids.shape()[0], T = ids.shape()[1];
  // T becomes the model's sequence length below, B x T the rows of every GEMM.
  if (T > model::limits::kSeqLength)
    fail("--input-ids '{}' has {} tokens per row; at most {} are supported", ids_path, T, model::limits::kSeqLength);
  const int64_t rows = checked_mul(B, T, "--input-ids batch x tokens");
  if (rows > model::limits::kBlasDim)
    fail("--input-ids '{}' holds {} x {} = {} tokens; at most {} fit one forward pass: split the batch", ids_path, B, T,
         rows, model::limits::kBlasDim);

  const auto kind = checkpoint::detect_checkpoint(load);
  if (kind == checkpoint::CheckpointKind::Empty)
    fail("--load '{}' holds neither a checkpoint (latest_checkpointed_iteration.txt) nor a HuggingFace model "
         "(config.json + safetensors)",
         load);
  Arguments a;
  checkpoint::HfSpec spec;
  int64_t it = iteration;
  if (kind == checkpoint::CheckpointKind::HuggingFace) {
    spec = checkpoint::read_hf_config(load);
    apply_hf_config(a, spec, (fs::path(load) / "config.json").string());
    apply_hf_vocab(a, spec, 0, load);
  } else {
    if (it < 0) it = *checkpoint::latest_iteration(load);
    const nlohmann::json args = checkpoint::read_state(load, it).args;
    checkpoint::model_args_from_json(args, a.model, a.tokenizer);
    checkpoint::use_saved_tokenizer(checkpoint::iteration_dir(load, it), args, a.tokenizer);
  }
  // One rank, fp32, no dropout; the RoPE table only needs to cover T.
  a.model.bf16 = false;
  a.model.attention_dropout = a.model.hidden_dropout = 0.f;
  a.model.seq_length = T;
  if (a.model.position_embedding_type == "learned_absolute" && T > a.model.max_position_embeddings)
    fail("--input-ids has {} tokens per row but the model has {} positions", T, a.model.max_position_embeddings);
  a.model.finalize();
  // The logits tensor [B*T, padded vocab] and the output copy [B*T, vocab], both fp32.
  const int64_t logits_bytes =
      checked_product({rows, a.model.vocab_size + a.model.orig_vocab_size, 4}, "logits of --input-ids (bytes)");
  check_host_memory(a.model, 4, 1, logits_bytes, "its fp32 parameters and the logits of --input-ids");
  std::optional<Activity> building(std::in_place, "building the model");
  model::GPTModel m(a.model);
  if (kind == checkpoint::CheckpointKind::HuggingFace) {
    checkpoint::load_hf_weights(load, m.params(), m.config());
  } else {
    checkpoint::LoadOptions lo;
    lo.load_optim = false;
    lo.load_rng = false;
    checkpoint::load_checkpoint(load, it, checkpoint::RankInfo{}, m.params(), nullptr, lo);
  }
  building.reset();
  Activity forward("running the forward pass");
  const int64_t V = a.model.orig_vocab_size, Vp = m.config().vocab_size;
  std::vector<int32_t> tokens(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t id = ids.at(i);
    if (id < 0 || id >= V) fail("--input-ids '{}': token {} at position {} is outside the vocabulary of {}", ids_path, id, i, V);
    tokens[static_cast<size_t>(i)] = static_cast<int32_t>(id);
  }
  Tensor l = m.logits(tokens, B, T);  // [B*T, Vp]
  std::vector<float> out(static_cast<size_t>(rows * V));
  const float* src = l.data<float>();
  for (int64_t r = 0; r < rows; ++r) std::memcpy(out.data() + r * V, src + r * Vp, static_cast<size_t>(V) * 4);
  write_npy_f32(out_path, {B, T, V}, out.data());
  std::printf("wrote logits [%lld, %lld, %lld] to %s\n", static_cast<long long>(B), static_cast<long long>(T),
              static_cast<long long>(V), out_path.c_str());
  return 0;
}

}  // namespace mt
