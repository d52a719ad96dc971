#include "training/flag_parser.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>

#include <yaml-cpp/yaml.h>

#include "core/error.h"
#include "core/files.h"
#include "training/suggest.h"

namespace mt {
namespace {

std::string range_text(const IntRange& r) {
  if (r.lo != INT64_MIN && r.hi != INT64_MAX) return fmt::format("; expected {} to {}", r.lo, r.hi);
  if (r.lo != INT64_MIN) return fmt::format("; expected at least {}", r.lo);
  if (r.hi != INT64_MAX) return fmt::format("; expected at most {}", r.hi);
  return "; expected a 64-bit integer";
}

[[noreturn]] void out_of_range(const std::string& flag, const std::string& v, const std::string& expected) {
  fail("{}: value out of range (got {}{})", flag, v, expected);
}

int64_t parse_int(const std::string& flag, const std::string& v, const IntRange& r = {}) {
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  // Integral floats like 1e3 are refused, as Megatron's argparse (type=int) refuses them.
  if (v.empty() || *end != '\0') fail("{} expects an integer, got '{}'", flag, v);
  if (errno == ERANGE || x < r.lo || x > r.hi) out_of_range(flag, v, range_text(r));
  return x;
}

uint64_t parse_uint(const std::string& flag, const std::string& v) {
  if (v.find('-') != std::string::npos) fail("{} must be non-negative, got {}", flag, v);  // strtoull wraps "-1"
  errno = 0;
  char* end = nullptr;
  unsigned long long x = std::strtoull(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0') fail("{} expects an integer, got '{}'", flag, v);
  if (errno == ERANGE) out_of_range(flag, v, "; expected at most 18446744073709551615");
  return x;
}

double parse_float(const std::string& flag, const std::string& v) {
  errno = 0;
  char* end = nullptr;
  double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0') fail("{} expects a number, got '{}'", flag, v);
  if (errno == ERANGE) out_of_range(flag, v, "; expected 0 or a magnitude from 2.2e-308 to 1.8e308");
  // strtod reads "inf" and "nan": no flag means anything by them (an infinite learning rate or a
  // NaN clip threshold would train garbage without a word).
  if (!std::isfinite(x)) fail("{} must be a finite number, got '{}'", flag, v);
  return x;
}

// A float flag: the value must survive the conversion (not overflow to inf, not flush a non-zero to 0).
float parse_float32(const std::string& flag, const std::string& v) {
  const double x = parse_float(flag, v);
  if (std::fabs(x) > std::numeric_limits<float>::max() ||
      (x != 0.0 && std::fabs(x) < std::numeric_limits<float>::denorm_min()))
    out_of_range(flag, v, "; expected 0 or a magnitude from 1.4e-45 to 3.4e38 (a 32-bit float)");
  return static_cast<float>(x);
}

std::string dashed(std::string k) {
  std::replace(k.begin(), k.end(), '_', '-');
  return k.rfind("--", 0) == 0 ? k : "--" + k;
}

}  // namespace

FlagParser::Flag& FlagParser::add(const std::string& name, const std::string& help) {
  MT_CHECK(!flags_.count(name), "flag {} registered twice", name);
  order_.push_back(name);
  Flag& f = flags_[name];
  f.name = name;
  f.help = help;
  f.group = group_;
  return f;
}

void FlagParser::store_true(const std::string& name, bool* t, const std::string& help) {
  auto& f = add(name, help);
  f.takes_value = false;
  f.set = [t](const std::string&) { *t = true; };
  f.get = [t] { return std::vector<std::string>{*t ? "true" : "false"}; };
}

void FlagParser::store_false(const std::string& name, bool* t, const std::string& help) {
  auto& f = add(name, help);
  f.takes_value = false;
  f.set = [t](const std::string&) { *t = false; };
  f.get = [t] { return std::vector<std::string>{*t ? "false" : "true"}; };
}

// --help states a default where the field starts non-zero (0 and "" mostly mean "derived" here,
// which the help text says) and the help does not already name it.
template <typename T>
std::string default_of(const T& v, const std::string& help) {
  if (help.find("default") != std::string::npos || v == T{}) return "";
  return fmt::format("{}", v);
}

void FlagParser::value(const std::string& name, int64_t* t, const std::string& help, IntRange range) {
  auto& f = add(name, help);
  f.default_text = default_of(*t, help);
  f.set = [t, name, range](const std::string& v) { *t = parse_int(name, v, range); };
  f.get = [t] { return std::vector<std::string>{fmt::format("{}", *t)}; };
}

void FlagParser::value(const std::string& name, uint64_t* t, const std::string& help) {
  auto& f = add(name, help);
  f.default_text = default_of(*t, help);
  f.set = [t, name](const std::string& v) { *t = parse_uint(name, v); };
  f.get = [t] { return std::vector<std::string>{fmt::format("{}", *t)}; };
}

void FlagParser::value(const std::string& name, double* t, const std::string& help) {
  auto& f = add(name, help);
  f.default_text = default_of(*t, help);
  f.set = [t, name](const std::string& v) { *t = parse_float(name, v); };
  f.get = [t] { return std::vector<std::string>{fmt::format("{}", *t)}; };
}

void FlagParser::value(const std::string& name, float* t, const std::string& help) {
  auto& f = add(name, help);
  f.default_text = default_of(*t, help);
  f.set = [t, name](const std::string& v) { *t = parse_float32(name, v); };
  f.get = [t] { return std::vector<std::string>{fmt::format("{}", *t)}; };
}

void FlagParser::value(const std::string& name, std::string* t, const std::string& help,
                       std::vector<std::string> choices) {
  std::string h = help;
  if (!choices.empty()) {
    h += " {";
    for (size_t i = 0; i < choices.size(); ++i) h += (i ? "," : "") + choices[i];
    h += "}";
  }
  auto& f = add(name, h);
  f.default_text = default_of(*t, help);
  f.set = [t, name, choices](const std::string& v) {
    if (!choices.empty() && std::find(choices.begin(), choices.end(), v) == choices.end()) {
      std::string list;
      for (size_t i = 0; i < choices.size(); ++i) list += (i ? ", " : "") + choices[i];
      std::string s = closest_match(v, choices);
      fail("{} got '{}'; expected one of: {}{}", name, v, list, s.empty() ? "" : " (did you mean '" + s + "'?)");
    }
    *t = v;
  };
  f.get = [t] { return std::vector<std::string>{*t}; };
}

void FlagParser::list(const std::string& name, std::vector<std::string>* t, const std::string& help) {
  auto& f = add(name, help);
  f.is_list = true;
  f.set_list = [t](const std::vector<std::string>& v) { *t = v; };
  f.get = [t] { return *t; };
}

void FlagParser::custom_list(const std::string& name, std::function<void(const std::vector<std::string>&)> fn,
                             const std::string& help) {
  auto& f = add(name, help);
  f.is_list = true;
  f.set_list = std::move(fn);
}

void FlagParser::custom(const std::string& name, bool takes_value, std::function<void(const std::string&)> fn,
                        const std::string& help) {
  auto& f = add(name, help);
  f.takes_value = takes_value;
  f.set = std::move(fn);
}

void FlagParser::ignored(const std::string& name, bool takes_value, bool is_list, const std::string& help) {
  auto& f = add(name, help);
  f.takes_value = takes_value || is_list;
  f.is_list = is_list;
  f.set = [](const std::string&) {};
  f.set_list = [](const std::vector<std::string>&) {};
}

void FlagParser::unsupported(const std::string& name, const std::string& why) { unsupported_[name] = why; }

std::vector<FlagParser::Current> FlagParser::current_values() const {
  std::vector<Current> out;
  for (const auto& n : order_) {
    const Flag& f = flags_.at(n);
    if (f.get) out.push_back({n, f.group, !f.takes_value, f.is_list, f.get()});
  }
  return out;
}

bool FlagParser::given(const std::string& name) const {
  return std::find(given_.begin(), given_.end(), name) != given_.end();
}

void FlagParser::unknown(const std::string& name, const std::string& source) const {
  auto u = unsupported_.find(name);
  if (u != unsupported_.end()) fail("{}{} is a Megatron-LM flag that megatron.cpp does not support yet: {}", source, name, u->second);
  std::vector<std::string> all(order_);
  std::string s = closest_match(name, all);
  fail("{}unknown flag {}{}; run 'megatron {} --help' for the list", source, name,
       s.empty() ? "" : " (did you mean " + s + "?)", command_);
}

void FlagParser::apply(const Flag& f, const std::vector<std::string>& values, const std::string& source) {
  if (f.is_list && values.empty()) fail("{}{} expects at least one value", source, f.name);
  try {
    if (f.is_list) f.set_list(values);
    else f.set(values.empty() ? std::string() : values[0]);
  } catch (const Error& e) {
    if (source.empty()) throw;
    fail("{}{}", source, e.what());  // a value from --config: say which file it came from
  }
  given_.erase(std::remove(given_.begin(), given_.end(), f.name), given_.end());
  given_.push_back(f.name);
}

void FlagParser::apply_yaml(const std::string& path) {
  // A FIFO or device would hang the read, a directory would throw from yaml-cpp, and a flag file
  // is a few KiB: refuse all of those by name before reading.
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail("--config: cannot read '{}' (no such file or not readable)", path);
  require_regular_file(path, "--config");
  const auto bytes = std::filesystem::file_size(path, ec);
  if (!ec && bytes > kMaxConfigBytes)
    fail("--config: '{}' is {} bytes; a flag file is expected to be under {} MiB", path, bytes, kMaxConfigBytes >> 20);
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    fail("--config: cannot read '{}' (no such file or not readable)", path);
  } catch (const YAML::Exception& e) {
    fail("--config: '{}' is not valid YAML: {}", path, e.what());
  }
  if (!root.IsMap()) fail("--config: '{}' must be a mapping of flag names to values", path);
  const std::string source = "--config " + path + ": ";
  try {
    for (const auto& kv : root) apply_yaml_entry(kv.first, kv.second, source);
  } catch (const YAML::Exception& e) {  // a shape the checks below did not foresee: still one clear line
    fail("{}{}", source, e.what());
  }
}

void FlagParser::apply_yaml_entry(const YAML::Node& key, const YAML::Node& v, const std::string& source) {
  if (!key.IsScalar()) fail("{}keys must be flag names (e.g. num_layers), not lists or mappings", source);
  const std::string name = dashed(key.Scalar());
  auto it = flags_.find(name);
  if (it == flags_.end()) unknown(name, source);
  const Flag& f = it->second;
  if (!f.takes_value) {
    bool on = false;
    if (!v.IsScalar() || !YAML::convert<bool>::decode(v, on)) fail("{}{} is a switch: use true or false", source, name);
    if (on) apply(f, {}, source);
    return;
  }
  std::vector<std::string> values;
  if (v.IsSequence()) {
    for (const auto& e : v) {
      // e.g. data_path: [[a, b]]: a flag's values are plain words, as on the command line.
      if (!e.IsScalar()) fail("{}{}: list entries must be plain values, not nested lists or mappings", source, name);
      values.push_back(e.Scalar());
    }
  } else if (v.IsScalar()) {
    values.push_back(v.Scalar());
  } else if (v.IsNull()) {
    return;
  } else {
    fail("{}{} must be a scalar or a list", source, name);
  }
  if (!f.is_list && values.size() != 1) fail("{}{} takes one value", source, name);
  apply(f, values, source);
}

void FlagParser::parse(const std::vector<std::string>& argv) {
  // --config first, wherever it appears, so the command line overrides the file.
  for (size_t i = 0; i < argv.size(); ++i) {
    if (argv[i] == "--help" || argv[i] == "-h") help_ = true;
    if (config_enabled_ && (argv[i] == "--config" || argv[i].rfind("--config=", 0) == 0)) {
      std::string path;
      if (argv[i] == "--config") {
        if (i + 1 >= argv.size()) fail("--config expects a YAML file path");
        path = argv[i + 1];
      } else {
        path = argv[i].substr(9);
      }
      apply_yaml(path);
    }
  }
  if (help_) return;
  for (size_t i = 0; i < argv.size(); ++i) {
    std::string tok = argv[i];
    if (tok.rfind("--", 0) != 0) fail("unexpected argument '{}' (flags start with --)", tok);
    std::string name = tok, inline_value;
    bool has_inline = false;
    if (auto eq = tok.find('='); eq != std::string::npos) {
      name = tok.substr(0, eq);
      inline_value = tok.substr(eq + 1);
      has_inline = true;
    }
    if (config_enabled_ && name == "--config") {
      if (!has_inline) ++i;
      continue;
    }
    auto it = flags_.find(name);
    if (it == flags_.end()) unknown(name, "");
    const Flag& f = it->second;
    std::vector<std::string> values;
    if (!f.takes_value) {
      if (has_inline) fail("{} is a switch and takes no value", name);
    } else if (has_inline) {
      values.push_back(inline_value);
    } else if (f.is_list) {
      while (i + 1 < argv.size() && argv[i + 1].rfind("--", 0) != 0) values.push_back(argv[++i]);
    } else {
      if (i + 1 >= argv.size()) fail("{} expects a value", name);
      values.push_back(argv[++i]);
    }
    apply(f, values, "");
  }
}

std::string FlagParser::help() const {
  std::string out = "usage: megatron " + command_ + " [flags]\n";
  // Groups in the order they were first registered; flags in registration order within each.
  std::vector<std::string> groups;
  for (const auto& n : order_)
    if (std::find(groups.begin(), groups.end(), flags_.at(n).group) == groups.end()) groups.push_back(flags_.at(n).group);
  for (const auto& g : groups) {
    out += "\n" + (g.empty() ? std::string("flags") : g) + ":\n";
    for (const auto& n : order_) {
      const Flag& f = flags_.at(n);
      if (f.group != g) continue;
      std::string lhs = "  " + n + (f.takes_value ? (f.is_list ? " V [V ...]" : " V") : "");
      if (lhs.size() < 40) lhs.resize(40, ' ');
      else lhs += "\n" + std::string(40, ' ');
      out += lhs + f.help + (f.default_text.empty() ? "" : " (default: " + f.default_text + ")") + "\n";
    }
  }
  if (config_enabled_) out += "  --config FILE.yaml                    the same flags as YAML keys; command-line flags override it\n";
  return out;
}

}  // namespace mt
