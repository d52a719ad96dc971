// megatron: one binary, several subcommands. Every user mistake surfaces as mt::Error and is
// printed on one line with exit code 2; nothing else is caught so real bugs stay loud.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "training/commands.h"

namespace {

void usage() {
  std::printf(
      "usage: megatron <command> [flags]\n\n"
      "commands:\n"
      "  pretrain    train a GPT/Llama model (Megatron-LM's pretrain_gpt.py flags)\n"
      "  generate    sample text from a checkpoint\n"
      "  preprocess  tokenize JSONL into Megatron .bin/.idx files (tools/preprocess_data.py flags)\n"
      "  launch      start N local ranks: megatron launch --nproc-per-node N -- pretrain ...\n"
      "  convert     HuggingFace models to checkpoints and back: convert --from hf|megatron --input D --output D\n"
      "  logits      forward pass to .npy: logits --load DIR_OR_HF_DIR --input-ids IDS.npy --output L.npy\n\n"
      "run 'megatron <command> --help' for its flags\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  std::string cmd = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  try {
    return mt::run_command(cmd, args);
  } catch (const mt::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "megatron %s: error: %s\n", cmd.c_str(), e.what());
    return 2;
  }
}
