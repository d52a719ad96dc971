#include "training/generate_prompts.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/files.h"

namespace mt {
namespace {

int64_t integer(const nlohmann::json& v, const std::string& where, const char* key, int64_t lo) {
  if (!v.is_number_integer()) fail("{}: \"{}\" must be an integer", where, key);
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    fail("{}: \"{}\" is out of range", where, key);
  const int64_t x = v.get<int64_t>();
  if (x < lo) fail("{}: \"{}\" must be >= {} (got {})", where, key, lo, x);
  return x;
}

float number(const nlohmann::json& v, const std::string& where, const char* key) {
  if (!v.is_number()) fail("{}: \"{}\" must be a number", where, key);
  const double d = v.get<double>();
  if (!std::isfinite(d) || std::fabs(d) > std::numeric_limits<float>::max())
    fail("{}: \"{}\" must be a finite number", where, key);
  return static_cast<float>(d);
}

}  // namespace

PromptLine parse_prompt_line(const std::string& line, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception&) {
    fail("{}: not valid JSON; each line must be an object such as {{\"prompt\": \"Hello\"}}", where);
  }
  if (!j.is_object()) fail("{}: each line must be a JSON object such as {{\"prompt\": \"Hello\"}}", where);
  PromptLine p;
  bool have_prompt = false;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    const nlohmann::json& v = it.value();
    if (key == "prompt") {
      if (!v.is_string()) fail("{}: \"prompt\" must be a string", where);
      p.prompt = v.get<std::string>();
      have_prompt = true;
    } else if (key == "max_new_tokens") {
      p.max_new_tokens = integer(v, where, "max_new_tokens", 0);
    } else if (key == "top_k") {
      p.top_k = integer(v, where, "top_k", 0);
    } else if (key == "seed") {
      if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0))
        fail("{}: \"seed\" must be a non-negative integer", where);
      p.seed = v.get<uint64_t>();
    } else if (key == "temperature") {
      p.temperature = number(v, where, "temperature");
    } else if (key == "top_p") {
      p.top_p = number(v, where, "top_p");
    } else if (key == "stop") {
      std::vector<std::string> stops;
      if (v.is_string()) {
        stops.push_back(v.get<std::string>());
      } else if (v.is_array()) {
        for (const auto& s : v) {
          if (!s.is_string()) fail("{}: \"stop\" must be a string or a list of strings", where);
          stops.push_back(s.get<std::string>());
        }
      } else {
        fail("{}: \"stop\" must be a string or a list of strings", where);
      }
      p.stop = std::move(stops);
    } else {
      fail("{}: unknown field \"{}\" (known: prompt, max_new_tokens, temperature, top_k, top_p, seed, stop)", where,
           key);
    }
  }
  if (!have_prompt) fail("{}: no \"prompt\" field; each line must be an object such as {{\"prompt\": \"Hello\"}}", where);
  return p;
}

std::vector<PromptLine> read_prompts_file(const std::string& path) {
  require_regular_file(path, "--prompts-file");
  std::ifstream f(path);
  if (!f) fail("--prompts-file: cannot read '{}'", path);
  std::vector<PromptLine> out;
  std::string line;
  for (int64_t n = 1; std::getline(f, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    out.push_back(parse_prompt_line(line, path + ":" + std::to_string(n)));
  }
  if (out.empty()) fail("--prompts-file '{}' holds no prompts (one JSON object per line: {{\"prompt\": \"Hello\"}})", path);
  return out;
}

}  // namespace mt
