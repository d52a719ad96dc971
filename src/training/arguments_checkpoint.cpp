// Pretrain's checkpoint section: where and how often to save, what to load.
#include <cstdint>

#include "core/error.h"
#include "training/arguments_sections.h"

namespace mt {

void register_checkpoint_flags(FlagParser& p, CheckpointArgs& a) {
  p.value("--save", &a.save, "checkpoint directory to save to");
  p.value("--load", &a.load, "checkpoint directory to load from");
  p.value("--save-interval", &a.save_interval, "iterations between checkpoints", {0, INT64_MAX});
  p.store_true("--no-save-optim", &a.no_save_optim, "do not save optimizer state");
  p.store_true("--no-save-rng", &a.no_save_rng, "do not save RNG state");
  p.store_true("--no-load-optim", &a.no_load_optim, "do not load optimizer state");
  p.store_true("--no-load-rng", &a.no_load_rng, "do not load RNG state");
  p.store_true("--finetune", &a.finetune, "load weights only; start at iteration 0");
  p.store_true("--async-save", &a.async_save, "write checkpoints in a background thread while training goes on");
  p.value("--save-retain-interval", &a.save_retain_interval,
          "keep only checkpoints of iterations divisible by this, and the latest", {0, INT64_MAX});
  p.custom("--ckpt-format", true,
           [&a](const std::string& v) {
             if (v == "native" || v == "torch_dist" || v == "torch") {
               a.ckpt_format = v;
               return;
             }
             if (v == "zarr" || v == "torch_dcp" || v == "fsdp_dtensor")
               fail("--ckpt-format {}: megatron.cpp reads Megatron-LM's torch_dist and torch checkpoints and writes "
                    "its own 'native' format; {} is neither",
                    v, v);
             fail("--ckpt-format got '{}'; choose native, torch_dist or torch", v);
           },
           "checkpoint format: native (sharded safetensors; loads under any TP/PP/DP layout); torch_dist "
           "(Megatron-LM's PyTorch distributed checkpoint: read, and written by --save); torch (legacy, read only)");
  p.store_true("--auto-detect-ckpt-format", &a.auto_detect_ckpt_format,
               "--load any format (native, HuggingFace, Megatron-LM torch_dist or torch), whatever --ckpt-format says");
}

void validate_checkpoint_args(const CheckpointArgs& a) {
  if (a.save_interval < 0) fail("--save-interval must be >= 0 (got {})", a.save_interval);
  if (a.save_interval > 0 && a.save.empty()) fail("--save-interval needs --save DIR");
  if (a.save_retain_interval < 0) fail("--save-retain-interval must be >= 0 (got {})", a.save_retain_interval);
  if (a.save_retain_interval > 0 && a.save.empty()) fail("--save-retain-interval needs --save DIR");
  if (a.ckpt_format == "torch" && !a.save.empty())
    fail("--ckpt-format torch with --save: megatron.cpp reads Megatron-LM's legacy torch checkpoints but does not "
         "write them; use --ckpt-format torch_dist (which Megatron-LM loads) or native");
  if (a.ckpt_format == "torch_dist" && a.async_save)
    fail("--ckpt-format torch_dist does not combine with --async-save yet; drop one of them");
}

checkpoint::SaveOptions save_options(const CheckpointArgs& c) {
  checkpoint::SaveOptions o;
  o.async = c.async_save;
  o.retain_interval = c.save_retain_interval;
  return o;
}

}  // namespace mt
