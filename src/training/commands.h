#pragma once
#include <string>
#include <vector>

namespace mt {
// Dispatches a subcommand; throws mt::Error for an unknown one (with a did-you-mean).
int run_command(const std::string& cmd, const std::vector<std::string>& args);
int pretrain_main(const std::vector<std::string>& args);
int generate_main(const std::vector<std::string>& args);
// `megatron convert --from hf|megatron ...`: HuggingFace models to checkpoints and back.
int convert_main(const std::vector<std::string>& args);
// `megatron logits --load DIR --input-ids IDS.npy --output LOGITS.npy`: forward pass to .npy.
int logits_main(const std::vector<std::string>& args);
// `megatron launch --nproc-per-node N ... -- pretrain ...`: starts and supervises local ranks.
int launch_main(const std::vector<std::string>& args);
// `megatron estimate <pretrain flags> --gpu-memory-gib G --world-size N`: memory, communication, FLOPs.
int estimate_main(const std::vector<std::string>& args);
// `megatron inspect-data`: the samples pretrain would read (JSON lines), or a dataset's summary.
int inspect_data_main(const std::vector<std::string>& args);
// `megatron serve --load DIR`: HTTP text generation (Megatron's PUT /api, OpenAI's /v1/completions).
int serve_main(const std::vector<std::string>& args);
}  // namespace mt
