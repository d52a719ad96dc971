#pragma once
// Small accessors for tokenizer.json fields, failing with the file and the field's path.
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace mt::data::hf {

// Where a tokenizer.json component sits, for error messages: "FILE: pre_tokenizer.pretokenizers[1]".
struct Where {
  std::string file;
  std::string path;
  Where child(std::string_view p) const { return {file, std::string(path).append(p)}; }
  Where index(size_t i) const { return {file, path + "[" + std::to_string(i) + "]"}; }
};

[[noreturn]] inline void bad(const Where& w, std::string_view msg) {
  fail("--tokenizer-model {}: {}: {}", w.file, w.path, msg);
}

inline std::string get_string(const nlohmann::json& j, const char* key, const Where& w,
                              std::string def = {}) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_string()) bad(w, std::string(key) + " must be a string");
  return it->get<std::string>();
}

inline bool get_bool(const nlohmann::json& j, const char* key, const Where& w, bool def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_boolean()) bad(w, std::string(key) + " must be true or false");
  return it->get<bool>();
}

inline int64_t get_int(const nlohmann::json& j, const char* key, const Where& w, int64_t def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_number_integer()) bad(w, std::string(key) + " must be an integer");
  return it->get<int64_t>();
}

inline const nlohmann::json& get_array(const nlohmann::json& j, const char* key, const Where& w) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_array()) bad(w, std::string(key) + " must be a list");
  return *it;
}

inline std::string type_of(const nlohmann::json& j, const Where& w) {
  if (!j.is_object()) bad(w, "expected an object with a \"type\"");
  return get_string(j, "type", w);
}

}  // namespace mt::data::hf
