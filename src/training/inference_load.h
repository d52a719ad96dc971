#pragma once
// A model for generation, from what --load names: a checkpoint directory (as pretrain --save wrote
// it; `iteration` or, when negative, the latest) or a HuggingFace model directory. Shared by
// `megatron generate` and `megatron serve`. The model is fp32 on the CPU and bf16 on the GPU
// (the caller holds the GpuContext); dropout is off.
#include <cstdint>
#include <memory>
#include <string>

#include "core/tensor.h"
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
InferenceModel load_inference_model(const std::string& load, int64_t iteration, Device device,
                                    bool need_tokenizer = true, comm::Communicator* tp = nullptr);

}  // namespace mt
