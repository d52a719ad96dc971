#pragma once
// Megatron's --moe-use-upcycling: an MoE model's first weights from a dense checkpoint
// (megatron/core/transformer/moe/upcycling_utils.py, facts only). Every parameter the dense model
// has is copied; each expert's fc1/fc2 is the dense MLP's, scaled so the layer's output starts
// where the dense MLP's was, and, with granularity G = dense ffn / moe ffn > 1, expert e takes
// part e % G of the dense hidden units; the router keeps its own initialisation with its first
// E / G rows repeated G times (the experts cut from one dense MLP share their router row).
#include "checkpoint/checkpoint.h"
#include "model/config.h"
#include "model/params.h"

namespace mt::checkpoint {

// The scale Megatron applies to the dense weights: the MoE layer's activation relative to the
// dense one, (E/G)·G·G / topk with pre-softmax routing (probs summing below one), else G; to the
// power 1/3 for SwiGLU (three matrices multiply), 1/2 otherwise.
double upcycling_weight_scale(const model::TransformerConfig& moe_cfg, int64_t granularity);

// Fills this rank's params (an MoE model) from `dense` (a checkpoint of the same model with
// dense MLPs of ffn = moe_ffn * G). Throws naming --load and the tensor when the dense checkpoint
// lacks a tensor or has another shape.
void upcycle_from_dense(CheckpointReader& dense, model::ParamStore& params, const model::TransformerConfig& moe_cfg,
                        const std::string& load_dir);

}  // namespace mt::checkpoint
