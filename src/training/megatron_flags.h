#pragma once
// Megatron-LM's pretrain flags as one table (megatron_flags.def): which ones megatron.cpp
// implements, accepts as no-ops, or rejects by name, and why. The parser takes its no-ops and
// rejections from here; docs/megatron-flags.md is generated from it; a test keeps it complete and
// consistent with the parser.
#include <span>
#include <vector>
#include <string>

namespace mt {

class FlagParser;

enum class MegatronFlagKind { SWITCH, VALUE, LIST };
enum class MegatronFlagStatus { IMPLEMENTED, NOOP, REJECTED };

struct MegatronFlag {
  const char* name;
  MegatronFlagKind kind;
  MegatronFlagStatus status;
  const char* group;  // Megatron's argument group
  const char* note;   // NOOP: why nothing changes; REJECTED: what it waits for
};

std::span<const MegatronFlag> megatron_flags();

// Registers the NOOP flags (accepted, no effect) and the REJECTED ones (refused by name) on the
// pretrain parser, after the sections have registered theirs.
void register_megatron_table(FlagParser& p);

// docs/megatron-flags.md: the table as Markdown, with pretrain's own flags that Megatron lacks.
std::string megatron_flags_markdown();

// `megatron flags [--markdown]`: prints the table (TSV) or the Markdown document.
int flags_main(const std::vector<std::string>& args);

}  // namespace mt
