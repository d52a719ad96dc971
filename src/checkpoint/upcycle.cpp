#include "checkpoint/upcycle.h"

#include <cmath>
#include <regex>

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

void write_param(model::Param& p, const std::vector<float>& full) {
  std::vector<float> shard(static_cast<size_t>(p.numel()));
  model::extract_shard(p, full.data(), shard.data());
  p.main.copy_from(Tensor::from_vector(shard, p.shape).to_device(p.main.device()));
}

}  // namespace

void upcycle_from_dense(CheckpointReader& dense, model::ParamStore& params, const model::TransformerConfig& c,
                        const std::string& load_dir) {
  static const std::regex expert_re(R"((.*\.mlp)\.experts\.local_experts\.(\d+)\.(linear_fc[12])\.(weight|bias))");
  const int64_t E = c.moe.num_experts, moe_ffn = c.moe.moe_ffn_hidden_size;
  for (auto& p : params.params()) {
    std::smatch m;
    if (std::regex_match(p.name, m, expert_re)) {
      const std::string src = m[1].str() + "." + m[3].str() + "." + m[4].str();
      if (!dense.has(src))
        fail("--moe-use-upcycling: the dense checkpoint in {} has no '{}' for '{}' (is it a dense checkpoint of "
             "this model?)",
             load_dir, src, p.name);
      const Shape shape = dense.shape(src);
      const bool fc1 = m[3].str() == "linear_fc1", weight = m[4].str() == "weight";
      const int64_t dense_ffn = fc1 ? shape[0] / (c.swiglu ? 2 : 1) : weight ? shape[1] : moe_ffn;
      if (dense_ffn % moe_ffn != 0 || E % (dense_ffn / moe_ffn) != 0)
        fail("--moe-use-upcycling: the dense FFN size {} in {} must be a multiple G of --moe-ffn-hidden-size {} with "
             "--num-experts {} divisible by G",
             dense_ffn, load_dir, moe_ffn, E);
      const int64_t G = dense_ffn / moe_ffn, e = std::stoll(m[2].str());
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
