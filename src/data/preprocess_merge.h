#pragma once
// `megatron preprocess --merge A B ... --output-prefix OUT` (tools/merge_datasets.py): appends
// datasets of one dtype into OUT.bin/.idx. A directory argument stands for every dataset in it,
// in sorted order, as merge_datasets.py --input DIR does.
#include <string>
#include <vector>

namespace mt::data {
std::vector<std::string> expand_merge_inputs(const std::vector<std::string>& items);
void merge_datasets(const std::vector<std::string>& prefixes, const std::string& output_prefix);
}  // namespace mt::data
