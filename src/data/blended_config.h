#pragma once
// How Megatron turns --split and --data-path into numbers (blended_megatron_dataset_config.py,
// utils.py, blended_megatron_dataset_builder.py), reproduced to the last floating-point bit:
// the split matrix decides which documents land in train/valid/test, the normalised weights
// decide the blend, so any difference here would change every sample.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mt::data {

enum class Split { Train = 0, Valid = 1, Test = 2 };
const char* split_name(Split s);  // "train", "valid", "test" (Megatron's Split enum names)

// numpy.sum over float64 (pairwise summation), and utils.normalize (w / sum(w)).
double numpy_sum(const double* a, size_t n);
std::vector<double> normalize_weights(const std::vector<double>& w);

// parse_and_normalize_split("969, 30, 1") -> {0.969, 0.03, 0.001}. Errors name --split.
std::vector<double> parse_and_normalize_split(const std::string& split);

// convert_split_vector_to_split_matrix: book-ends [lo, hi) per split, nullopt for an empty one.
using SplitMatrix = std::array<std::optional<std::pair<double, double>>, 3>;
SplitMatrix split_matrix_from_vector(const std::vector<double>& v);
// The sequence range [begin, end) a book-end selects from `count` sequences (Python's round()).
std::pair<int64_t, int64_t> split_range(const std::pair<double, double>& bookend, int64_t count);

// get_blend_from_list: "A B" (no weights) or "0.3 A 0.7 B" (weights as given, not normalised).
struct Blend {
  std::vector<std::string> prefixes;
  std::vector<double> weights;  // empty when the list has no weights
};
// `flag` names the option in error messages. Entries may themselves hold spaces ("0.3 A 0.7 B").
Blend parse_blend(const std::vector<std::string>& list, const std::string& flag);

// _get_size_per_split_per_dataset for one split: ceil(ceil(target * w) * (1 + surplus)).
int64_t blend_dataset_size(double normalized_weight, int64_t target, double surplus);
// Megatron's --mid-level-dataset-surplus default.
constexpr double kMidLevelDatasetSurplus = 0.005;

}  // namespace mt::data
