#pragma once
// HuggingFace model directories in and out: weights into a model's parameters (this rank's TP
// shards cut from the full tensors), and a HuggingFace directory written from full tensors.
#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "checkpoint/hf_config.h"
#include "model/params.h"

namespace mt::checkpoint {

// Fills `params` (any TP shards, any pipeline stage's part) from the HF model in `dir`, whose
// config.json must describe `cfg` (the model built from it). With `all_local` every model
// tensor is on this rank, and HF tensors left unused are an error naming them.
void load_hf_weights(const std::string& dir, model::ParamStore& params, const model::TransformerConfig& cfg,
                     bool all_local = true);

struct HfExportOptions {
  DType dtype = DType::BF16;
  bool v5_style = false;                      // rope_parameters / dtype instead of rope_theta / torch_dtype
  int64_t max_shard_bytes = int64_t{5} << 30;  // larger models are split with model.safetensors.index.json
};
// Writes config.json and the safetensors of `spec` into `out_dir`; `get(name, shape)` returns the
// full Megatron tensor `name` (padded vocabulary) of that shape.
void write_hf_model(const std::string& out_dir, const HfSpec& spec,
                    const std::function<std::vector<float>(const std::string&)>& get,
                    const std::function<Shape(const std::string&)>& shape_of, const HfExportOptions& o);

}  // namespace mt::checkpoint
