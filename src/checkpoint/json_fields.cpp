#include "checkpoint/json_fields.h"

#include <cmath>

#include "core/error.h"

namespace mt::checkpoint {

std::string json_brief(const nlohmann::json& v) {
  // Never dump a nested value: dumping recurses, and a hostile file may nest millions deep.
  if (v.is_array()) return fmt::format("an array of {} elements", v.size());
  if (v.is_object()) return fmt::format("an object of {} keys", v.size());
  std::string s = v.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

namespace {

std::string range(int64_t lo, int64_t hi) {
  if (hi == INT64_MAX) return fmt::format(">= {}", lo);
  return fmt::format("between {} and {}", lo, hi);
}

}  // namespace

int64_t json_int(const nlohmann::json& v, const std::string& what, int64_t lo, int64_t hi) {
  int64_t x = 0;
  bool ok = false;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    ok = u <= static_cast<uint64_t>(INT64_MAX);
    x = ok ? static_cast<int64_t>(u) : INT64_MAX;
  } else if (v.is_number_integer()) {
    x = v.get<int64_t>();
    ok = true;
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && std::floor(d) != d) fail("{} must be an integer, got {}", what, json_brief(v));
    // Beyond +-9.2e18 the cast below would be undefined: such values are out of any range anyway.
    ok = std::isfinite(d) && std::fabs(d) < 9.2e18;
    x = ok ? static_cast<int64_t>(d) : 0;
  } else {
    fail("{} must be an integer, got {}", what, json_brief(v));
  }
  if (!ok || x < lo || x > hi) fail("{} must be an integer {}, got {}", what, range(lo, hi), json_brief(v));
  return x;
}

uint64_t json_uint(const nlohmann::json& v, const std::string& what, uint64_t hi) {
  if (v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0)) {
    const uint64_t u = v.get<uint64_t>();
    if (u <= hi) return u;
  }
  fail("{} must be an integer between 0 and {}, got {}", what, hi, json_brief(v));
}

double json_number(const nlohmann::json& v, const std::string& what, double lo, double hi) {
  if (!v.is_number()) fail("{} must be a number, got {}", what, json_brief(v));
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < lo || d > hi) fail("{} must be a number between {} and {}, got {}", what, lo, hi, json_brief(v));
  return d;
}

bool json_bool(const nlohmann::json& v, const std::string& what) {
  if (!v.is_boolean()) fail("{} must be true or false, got {}", what, json_brief(v));
  return v.get<bool>();
}

std::string json_string(const nlohmann::json& v, const std::string& what) {
  if (!v.is_string()) fail("{} must be a string, got {}", what, json_brief(v));
  return v.get<std::string>();
}

std::vector<int64_t> json_int_array(const nlohmann::json& v, const std::string& what, int64_t lo, int64_t hi,
                                    int64_t size) {
  if (!v.is_array()) fail("{} must be an array of integers, got {}", what, json_brief(v));
  if (size >= 0 && static_cast<int64_t>(v.size()) != size)
    fail("{} must hold {} integers, got {}", what, size, json_brief(v));
  std::vector<int64_t> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) out.push_back(json_int(v[i], fmt::format("{}[{}]", what, i), lo, hi));
  return out;
}

JsonFields::JsonFields(const nlohmann::json& j, std::string where) : j_(j), where_(std::move(where)) {
  if (!j_.is_object()) fail("{}: expected a JSON object, got {}", where_, json_brief(j_));
}

bool JsonFields::has(const char* key) const {
  auto it = j_.find(key);
  return it != j_.end() && !it->is_null();
}

const nlohmann::json& JsonFields::at(const char* key) const {
  auto it = j_.find(key);
  if (it == j_.end()) fail("{}: key '{}' is missing", where_, key);
  return *it;
}

int64_t JsonFields::integer_or(const char* key, int64_t dflt, int64_t lo, int64_t hi) const {
  return has(key) ? integer(key, lo, hi) : dflt;
}

double JsonFields::number_or(const char* key, double dflt, double lo, double hi) const {
  return has(key) ? json_number(at(key), what(key), lo, hi) : dflt;
}

bool JsonFields::boolean_or(const char* key, bool dflt) const { return has(key) ? boolean(key) : dflt; }

std::string JsonFields::string_or(const char* key, const std::string& dflt) const {
  return has(key) ? json_string(at(key), what(key)) : dflt;
}

}  // namespace mt::checkpoint
