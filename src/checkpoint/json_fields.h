#pragma once
// Typed, range-checked reads of untrusted JSON (HF config.json, a checkpoint's metadata.json and
// state.json, safetensors headers). nlohmann's own conversions truncate 64.5 to 64, wrap -1 into
// a huge unsigned and throw type errors that name neither the file nor the key; these throw
// mt::Error "<where>: <key> must be ..., got <value>" instead.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mt::checkpoint {

// One value; `what` names it in errors (e.g. "'/m/config.json': hidden_size").
// An integer in [lo, hi]; a float is accepted only when integral (4096.0, 1e3).
int64_t json_int(const nlohmann::json& v, const std::string& what, int64_t lo, int64_t hi);
// An unsigned 64-bit integer (RNG seeds and offsets, CRCs) up to `hi`.
uint64_t json_uint(const nlohmann::json& v, const std::string& what, uint64_t hi = UINT64_MAX);
// A finite number in [lo, hi].
double json_number(const nlohmann::json& v, const std::string& what, double lo, double hi);
bool json_bool(const nlohmann::json& v, const std::string& what);
std::string json_string(const nlohmann::json& v, const std::string& what);
// An array of integers in [lo, hi]; `size` >= 0 demands exactly that many.
std::vector<int64_t> json_int_array(const nlohmann::json& v, const std::string& what, int64_t lo, int64_t hi,
                                    int64_t size = -1);

// Keyed reads of one JSON object: absent (and, for the *_or forms, null) keys are an error or
// the default. `where` names the file.
class JsonFields {
 public:
  // Throws naming `where` when `j` is not an object.
  JsonFields(const nlohmann::json& j, std::string where);
  bool has(const char* key) const;  // present and not null
  const nlohmann::json& at(const char* key) const;  // throws "<where>: key '<key>' is missing"
  std::string what(const char* key) const { return where_ + ": " + key; }

  int64_t integer(const char* key, int64_t lo, int64_t hi) const { return json_int(at(key), what(key), lo, hi); }
  int64_t integer_or(const char* key, int64_t dflt, int64_t lo, int64_t hi) const;
  uint64_t uinteger(const char* key) const { return json_uint(at(key), what(key)); }
  double number_or(const char* key, double dflt, double lo, double hi) const;
  bool boolean(const char* key) const { return json_bool(at(key), what(key)); }
  bool boolean_or(const char* key, bool dflt) const;
  std::string string_or(const char* key, const std::string& dflt) const;
  const std::string& where() const { return where_; }

 private:
  const nlohmann::json& j_;
  std::string where_;
};

// A short rendering of a value for error messages (a hostile file may hold megabytes in one).
std::string json_brief(const nlohmann::json& v);

}  // namespace mt::checkpoint
