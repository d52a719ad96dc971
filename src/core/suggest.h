#pragma once
// Did-you-mean helpers for flags and commands; core so every layer (data, training, cli) can use them.
#include <string>
#include <vector>

namespace mt {
// Damerau-Levenshtein distance; used for did-you-mean on flags and commands.
size_t edit_distance(const std::string& a, const std::string& b);
// The closest candidate within a distance that scales with length, or "" if none is close.
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);
}  // namespace mt
