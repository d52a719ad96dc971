// megatron: one binary, several subcommands. Every user mistake surfaces as mt::Error and is
// printed on one line with exit code 2. Any other exception (a std::bad_alloc, a library's
// exception, even one escaping a worker thread) is printed on one line too, with exit code 1:
// a crash dump tells a user nothing, and the line names what was being done where it can.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/error_report.h"
#include "core/version.h"
#include "training/commands.h"

namespace {

void usage() {
  std::printf(
      "usage: megatron <command> [flags]\n\n"
      "commands:\n"
      "  pretrain      train a GPT/Llama model (Megatron-LM's pretrain_gpt.py flags)\n"
      "  generate      sample text from a checkpoint\n"
      "  serve         HTTP text generation: Megatron's PUT /api and OpenAI's POST /v1/completions\n"
      "  preprocess    tokenize JSONL into Megatron .bin/.idx files (tools/preprocess_data.py flags)\n"
      "  launch        start N local ranks: megatron launch --nproc-per-node N -- pretrain ...\n"
      "  convert       HuggingFace models to checkpoints and back: convert --from hf|megatron --input D --output D\n"
      "  logits        forward pass to .npy: logits --load DIR_OR_HF_DIR --input-ids IDS.npy --output L.npy\n"
      "  estimate      per-GPU memory, communication and FLOPs of a pretrain run, and whether it fits\n"
      "  inspect-data  the samples pretrain would read (JSON lines); --info PREFIX summarises a .bin/.idx\n"
      "  flags         every Megatron-LM pretrain flag and its status here (--markdown: docs/megatron-flags.md)\n\n"
      "run 'megatron <command> --help' for its flags, 'megatron --version' for the version\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "--version")) {
    std::printf("%s\n", mt::megatron_version().c_str());
    return 0;
  }
  const std::string cmd = argv[1], prefix = "megatron " + cmd;
  mt::report_terminate_as_error(prefix);
  try {
    std::vector<std::string> args(argv + 2, argv + argc);
    return mt::run_command(cmd, args);
  } catch (const mt::Error&) {
    mt::print_error_line(prefix, mt::describe_exception(std::current_exception()));
    return 2;
  } catch (...) {
    mt::print_error_line(prefix, mt::describe_exception(std::current_exception()));
    return 1;
  }
}
