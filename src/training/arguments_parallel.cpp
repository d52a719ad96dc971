// Pretrain's parallel section: the parallel sizes and the pipeline split, data parallelism's
// options, and the rules between them.
#include "core/checked.h"
#include "core/error.h"
#include "core/log.h"
#include "model/config.h"
#include "parallel/pipeline_layout.h"
#include "parallel/schedule.h"
#include "training/arguments_sections.h"

namespace mt {
namespace {
namespace limits = model::limits;
}  // namespace

void register_parallel_flags(FlagParser& p, ParallelArgs& a) {
  p.value("--tensor-model-parallel-size", &a.tensor_model_parallel_size, "tensor-parallel size", {1, kMaxParallel});
  p.value("--pipeline-model-parallel-size", &a.pipeline_model_parallel_size, "pipeline-parallel size", {1, kMaxParallel});
  p.value("--decoder-first-pipeline-num-layers", &a.decoder_first_pipeline_num_layers,
          "layers on the first pipeline stage (uneven split)", {1, limits::kLayers});
  p.value("--decoder-last-pipeline-num-layers", &a.decoder_last_pipeline_num_layers,
          "layers on the last pipeline stage (uneven split)", {1, limits::kLayers});
  p.value("--num-layers-per-virtual-pipeline-stage", &a.num_layers_per_virtual_pipeline_stage,
          "layers per virtual pipeline stage (interleaved 1F1B schedule)", {1, limits::kLayers});
  p.value("--num-virtual-stages-per-pipeline-rank", &a.num_virtual_stages_per_pipeline_rank,
          "virtual pipeline stages per pipeline rank (interleaved 1F1B schedule)", {1, limits::kLayers});
  p.value("--microbatch-group-size-per-virtual-pipeline-stage", &a.microbatch_group_size_per_vp_stage,
          "interleaved schedule: micro-batches a virtual stage runs in a row (default: pipeline size)", {1, kMaxGlobalBatch});
  p.value("--context-parallel-size", &a.context_parallel_size, "context-parallel size", {1, kMaxParallel});
  p.value("--expert-model-parallel-size", &a.expert_model_parallel_size, "expert-parallel size", {1, kMaxParallel});
  p.value("--expert-tensor-parallel-size", &a.expert_tensor_parallel_size,
          "tensor-parallel size of the experts (default: --tensor-model-parallel-size)", {1, kMaxParallel});
  p.store_true("--sequence-parallel", &a.sequence_parallel, "sequence parallelism (with TP)");
  p.store_true("--tp-comm-overlap", &a.tp_comm_overlap,
               "overlap the sequence-parallel all-gathers and reduce-scatters of the column-parallel linears with "
               "their GEMMs");
  p.store_true("--use-distributed-optimizer", &a.use_distributed_optimizer, "ZeRO-1 distributed optimizer");
  p.store_true("--overlap-grad-reduce", &a.overlap_grad_reduce, "reduce gradient buckets while backward runs");
  p.store_true("--overlap-param-gather", &a.overlap_param_gather,
               "all-gather updated parameters while the next forward runs (distributed optimizer)");
  p.value("--ddp-bucket-size", &a.ddp_bucket_size, "elements per gradient bucket (default: Megatron's)", {1, kMaxBucketElements});
  p.value("--distributed-timeout-minutes", &a.distributed_timeout_minutes,
          "how long a rank waits for the others before failing (default 10)", {1, kMaxTimeoutMinutes});
  p.value("--distributed-backend", &a.distributed_backend, "collectives backend", {"nccl", "gloo"});
}

void validate_parallel_args(Arguments& a) {
  for (auto [name, v] : {std::pair{"--tensor-model-parallel-size", a.tensor_model_parallel_size},
                         {"--pipeline-model-parallel-size", a.pipeline_model_parallel_size},
                         {"--context-parallel-size", a.context_parallel_size},
                         {"--expert-model-parallel-size", a.expert_model_parallel_size}})
    if (v < 1) fail("{} must be at least 1 (got {})", name, v);
  const int64_t mp = checked_product({a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.context_parallel_size},
                                     "--tensor-model-parallel-size x --pipeline-model-parallel-size x --context-parallel-size");
  if (a.world_size % mp != 0)
    fail("world size {} is not divisible by --tensor-model-parallel-size ({}) x --pipeline-model-parallel-size ({}) x "
         "--context-parallel-size ({}); start a multiple of {} processes",
         a.world_size, a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.context_parallel_size, mp);
  a.data_parallel_size = a.world_size / mp;
  if (a.sequence_parallel && a.tensor_model_parallel_size == 1) {
    // Megatron turns it off too: there is no sequence to split without TP.
    log_warn("--sequence-parallel has no effect with --tensor-model-parallel-size 1; disabling it");
    a.sequence_parallel = false;
  }
  if (a.tp_comm_overlap && !a.sequence_parallel)
    fail("--tp-comm-overlap overlaps the sequence-parallel communication with the GEMMs: it needs "
         "--sequence-parallel and --tensor-model-parallel-size > 1");
  if (a.overlap_param_gather && !a.use_distributed_optimizer)
    fail("--overlap-param-gather needs --use-distributed-optimizer (only it gathers parameters)");
  if (a.ddp_bucket_size < 0) fail("--ddp-bucket-size must be positive (got {})", a.ddp_bucket_size);
  if (a.distributed_timeout_minutes <= 0)
    fail("--distributed-timeout-minutes must be positive (got {})", a.distributed_timeout_minutes);
}

// Megatron's pipeline rules: the layer split (PipelineLayout) and, for the interleaved
// schedule, the micro-batch count.
void validate_pipeline_args(Arguments& a) {
  for (auto [f, v] : {std::pair<const char*, int64_t>{"--decoder-first-pipeline-num-layers",
                                                      a.decoder_first_pipeline_num_layers},
                      {"--decoder-last-pipeline-num-layers", a.decoder_last_pipeline_num_layers},
                      {"--num-layers-per-virtual-pipeline-stage", a.num_layers_per_virtual_pipeline_stage},
                      {"--num-virtual-stages-per-pipeline-rank", a.num_virtual_stages_per_pipeline_rank},
                      {"--microbatch-group-size-per-virtual-pipeline-stage", a.microbatch_group_size_per_vp_stage}})
    if (a.was_given(f) && v <= 0) fail("{} must be positive (got {})", f, v);
  const parallel::PipelineLayout layout(a.model.num_layers, pipeline_options(a));
  a.virtual_pipeline_model_parallel_size = layout.vpp();
  const int64_t microbatches = a.global_batch_size / (a.micro_batch_size * a.data_parallel_size);
  if (layout.vpp() > 1)
    parallel::check_interleaved_microbatches(microbatches, layout.pp(), a.microbatch_group_size_per_vp_stage);
  else if (a.microbatch_group_size_per_vp_stage > 0)
    fail("--microbatch-group-size-per-virtual-pipeline-stage needs virtual pipeline stages "
         "(--num-virtual-stages-per-pipeline-rank or --num-layers-per-virtual-pipeline-stage)");
}

parallel::PipelineOptions pipeline_options(const ParallelArgs& a) {
  return {.pp = a.pipeline_model_parallel_size,
          .num_layers_per_virtual_stage = a.num_layers_per_virtual_pipeline_stage,
          .virtual_stages_per_rank = a.num_virtual_stages_per_pipeline_rank,
          .first_stage_layers = a.decoder_first_pipeline_num_layers,
          .last_stage_layers = a.decoder_last_pipeline_num_layers};
}

parallel::DDPOptions ddp_options(const ParallelArgs& a) {
  parallel::DDPOptions dd;
  dd.overlap_grad_reduce = a.overlap_grad_reduce;
  dd.use_distributed_optimizer = a.use_distributed_optimizer;
  dd.overlap_param_gather = a.overlap_param_gather;
  dd.bucket_size = a.ddp_bucket_size;
  return dd;
}

}  // namespace mt
