#pragma once
// A model for generation, from what --load names: a checkpoint directory (as pretrain --save wrote
// it; `iteration` or, when negative, the latest) or a HuggingFace model directory. Shared by
// `megatron generate` and `megatron serve`. The model is fp32 on the CPU and bf16 on the GPU
// (the caller holds the GpuContext); dropout is off.
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "comm/env.h"
#include "comm/world.h"
#include "core/tensor.h"
#include "kernels/device.h"
#include "data/tokenizer.h"
#include "model/gpt_model.h"
#include "training/arguments.h"

namespace mt {

struct InferenceModel {
  Arguments args;  // the model's shape and tokenizer options as loaded
  std::unique_ptr<model::GPTModel> model;
  std::unique_ptr<data::Tokenizer> tokenizer;  // null only where !need_tokenizer and the HF dir has none
};

// Fails (mt::Error naming --load or --iteration) for a directory that is neither, or a missing
// iteration; `need_tokenizer`: also for an HF directory without tokenizer files.
// `tp` (a communicator of more than one rank): this rank's tensor-parallel shard of a native
// checkpoint, resharded as a training resume would (an HF directory is refused: convert it first).
// --fp8-format's help for generate and serve (Megatron's flag; forward operands are E4M3 either way).
inline constexpr const char* kFp8InferenceHelp =
    "FP8 weights for the transformer layers' linears (QKV, projection, fc1, fc2): quantised once at load with a "
    "per-tensor scale, activations quantised per call; e4m3 or hybrid (the same for inference: forward operands are "
    "E4M3). Embedding, norms and output layer stay in the activation type";

// `fp8_weights` (generate / serve --fp8-format): the transformer layers' linears run with FP8
// weights quantised here, once (model/fp8_inference.h); a checkpoint trained with
// --first-last-layers-bf16 keeps those layers in bf16 as its training did.
InferenceModel load_inference_model(const std::string& load, int64_t iteration, Device device,
                                    bool need_tokenizer = true, comm::Communicator* tp = nullptr,
                                    bool fp8_weights = false);

// The GPU and the tensor-parallel world of one generate / serve rank, set up the same way for
// both. Declared in this order so that the GPU outlives the world (and the caller's model).
struct InferenceRanks {
  std::optional<ops::GpuContext> gpu;
  std::optional<comm::World> world;
  comm::Communicator* tp() const { return world ? world->world().get() : nullptr; }
};

// device "cuda": this rank's GPU (its local rank), failing by name when the node runs more ranks
// than it has GPUs; tp > 1: the world over every rank, each wait bounded by `timeout`.
void open_inference_ranks(InferenceRanks& ranks, const comm::DistEnv& env, const std::string& device, int64_t tp,
                          std::chrono::milliseconds timeout);

}  // namespace mt
