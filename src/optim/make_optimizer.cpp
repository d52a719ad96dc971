// Factory and the checks torch.optim makes on construction, reported with Megatron's flags.
#include <cmath>

#include "core/error.h"
#include "optim/adamw.h"
#include "optim/optimizer.h"
#include "optim/sgd.h"

namespace mt::optim {

namespace {
void validate(const OptimizerConfig& cfg) {
  if (!(cfg.lr >= 0.0f)) mt::fail("--lr must be >= 0, got {}", cfg.lr);
  if (!(cfg.weight_decay >= 0.0f)) mt::fail("--weight-decay must be >= 0, got {}", cfg.weight_decay);
  if (cfg.type == "adam") {
    if (!(cfg.adam_beta1 >= 0.0f && cfg.adam_beta1 < 1.0f))
      mt::fail("--adam-beta1 must be in [0, 1), got {}", cfg.adam_beta1);
    if (!(cfg.adam_beta2 >= 0.0f && cfg.adam_beta2 < 1.0f))
      mt::fail("--adam-beta2 must be in [0, 1), got {}", cfg.adam_beta2);
    if (!(cfg.adam_eps >= 0.0f)) mt::fail("--adam-eps must be >= 0, got {}", cfg.adam_eps);
  } else if (cfg.type == "sgd") {
    if (!(cfg.sgd_momentum >= 0.0f)) mt::fail("--sgd-momentum must be >= 0, got {}", cfg.sgd_momentum);
  } else {
    mt::fail("--optimizer must be 'adam' or 'sgd', got '{}'", cfg.type);
  }
}
}  // namespace

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& cfg, int64_t numel, std::vector<ParamSpan> spans,
                                          Device device) {
  validate(cfg);
  if (cfg.type == "adam") return std::make_unique<AdamW>(cfg, numel, std::move(spans), device);
  return std::make_unique<SGD>(cfg, numel, std::move(spans), device);
}

}  // namespace mt::optim
