#include "checkpoint/upcycle.h"

#include <cmath>
#include <optional>
#include <string>

#include "core/error.h"

namespace mt::checkpoint {

double upcycling_weight_scale(const model::TransformerConfig& c, int64_t G) {
  const auto& m = c.moe;
  const double activation = m.pre_softmax ? static_cast<double>(m.num_experts / G) * static_cast<double>(G * G) /
                                                static_cast<double>(m.topk)
                                          : static_cast<double>(G);
  return std::pow(activation, c.swiglu ? 1.0 / 3.0 : 0.5);
}

namespace {

// Part `part` of G along the rows of a dense fc1 [rows, h] (SwiGLU: [gate; up], each cut in G and
// the parts paired as [gate_part; up_part]) or the columns of fc2 [h, ffn], scaled.
std::vector<float> expert_part(const std::vector<float>& dense, const Shape& shape, bool fc1, bool swiglu, int64_t G,
                               int64_t part, double scale) {
  std::vector<float> out;
  if (fc1) {
    const int64_t rows = shape[0], cols = shape.size() > 1 ? shape[1] : 1;
    const int64_t blocks = swiglu ? 2 : 1, per_block = rows / blocks, per_part = per_block / G;
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t r = 0; r < per_part; ++r) {
        const int64_t src = b * per_block + part * per_part + r;
        for (int64_t j = 0; j < cols; ++j) out.push_back(static_cast<float>(dense[src * cols + j] * scale));
      }
  } else {
    const int64_t rows = shape[0], cols = shape[1], per_part = cols / G;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < per_part; ++j)
        out.push_back(static_cast<float>(dense[r * cols + part * per_part + j] * scale));
  }
  return out;
}

// A routed expert's parameter, "<layer>.mlp.experts.local_experts.<e>.<linear_fc1|linear_fc2>.<weight|bias>",
// split into its parts (parsed by hand: std::regex doubled this file's build time).
struct ExpertParam {
  std::string mlp, fc, kind;  // "<layer>.mlp", "linear_fc1" or "linear_fc2", "weight" or "bias"
  int64_t expert = 0;
};

std::optional<ExpertParam> parse_expert_param(const std::string& name) {
  static const std::string mid = ".mlp.experts.local_experts.";
  const size_t at = name.rfind(mid);
  if (at == std::string::npos) return std::nullopt;
  const size_t first = at + mid.size();
  size_t end = first;
  while (end < name.size() && name[end] >= '0' && name[end] <= '9') ++end;
  if (end == first || end == name.size() || name[end] != '.') return std::nullopt;
  const std::string rest = name.substr(end + 1);
  for (const char* fc : {"linear_fc1", "linear_fc2"})
    for (const char* kind : {"weight", "bias"})
      if (rest == std::string(fc) + "." + kind)
        return ExpertParam{name.substr(0, at) + ".mlp", fc, kind, std::stoll(name.substr(first, end - first))};
  return std::nullopt;
}

void write_param(model::Param& p, const std::vector<float>& full) {
  std::vector<float> shard(static_cast<size_t>(p.numel()));
  model::extract_shard(p, full.data(), shard.data());
  p.main.copy_from(Tensor::from_vector(shard, p.shape).to_device(p.main.device()));
}

}  // namespace

void upcycle_from_dense(CheckpointReader& dense, model::ParamStore& params, const model::TransformerConfig& c,
                        const std::string& load_dir) {
  const int64_t E = c.moe.num_experts, moe_ffn = c.moe.moe_ffn_hidden_size;
  for (auto& p : params.params()) {
    if (const std::optional<ExpertParam> m = parse_expert_param(p.name)) {
      const std::string src = m->mlp + "." + m->fc + "." + m->kind;
      if (!dense.has(src))
        fail("--moe-use-upcycling: the dense checkpoint in {} has no '{}' for '{}' (is it a dense checkpoint of "
             "this model?)",
             load_dir, src, p.name);
      const Shape shape = dense.shape(src);
      const bool fc1 = m->fc == "linear_fc1", weight = m->kind == "weight";
      const int64_t dense_ffn = fc1 ? shape[0] / (c.swiglu ? 2 : 1) : weight ? shape[1] : moe_ffn;
      if (dense_ffn % moe_ffn != 0 || E % (dense_ffn / moe_ffn) != 0)
        fail("--moe-use-upcycling: the dense FFN size {} in {} must be a multiple G of --moe-ffn-hidden-size {} with "
             "--num-experts {} divisible by G",
             dense_ffn, load_dir, moe_ffn, E);
      const int64_t G = dense_ffn / moe_ffn, e = m->expert;
      const double scale = upcycling_weight_scale(c, G);
      const std::vector<float> d = dense.read(src);
      // fc2's bias is shared by the expert's whole output: repeated, unscaled (as Megatron).
      if (!fc1 && !weight) write_param(p, d);
      else write_param(p, expert_part(d, shape, fc1, c.swiglu, G, e % G, scale));
      continue;
    }
    if (p.name.size() > 14 && p.name.ends_with(".router.weight")) {
      // Rows of the router's own init: the first E / G, each repeated G times (G from the first
      // layer's dense fc1, which every MoE layer shares).
      const std::string fc1 = p.name.substr(0, p.name.size() - 14) + ".linear_fc1.weight";
      if (!dense.has(fc1)) fail("--moe-use-upcycling: the dense checkpoint in {} has no '{}'", load_dir, fc1);
      const int64_t G = dense.shape(fc1)[0] / (c.swiglu ? 2 : 1) / moe_ffn;
      if (G > 1) {
        std::vector<float> w = p.main.to_device(Device::CPU).to_vector(), out;
        const int64_t h = p.shape[1];
        for (int64_t r = 0; r < E / G; ++r)
          for (int64_t k = 0; k < G; ++k) out.insert(out.end(), w.begin() + r * h, w.begin() + (r + 1) * h);
        write_param(p, out);
      }
      continue;
    }
    if (p.name.ends_with(".router.expert_bias") || p.name.find(".shared_experts.") != std::string::npos) continue;
    if (!dense.has(p.name))
      fail("--moe-use-upcycling: the dense checkpoint in {} has no '{}' (is it a checkpoint of this model's dense "
           "version?)",
           load_dir, p.name);
    if (dense.shape(p.name) != p.full_shape)
      fail("--moe-use-upcycling: '{}' is {} in {} but {} in this model", p.name, shape_to_string(dense.shape(p.name)),
           load_dir, shape_to_string(p.full_shape));
    write_param(p, dense.read(p.name));
  }
  params.sync_model_from_main();
}

}  // namespace mt::checkpoint
