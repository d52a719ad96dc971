#pragma once
// A table of Megatron-style flags bound to typed fields. Why not CLI11: Megatron users need
// its exact spellings (store_true/store_false pairs, nargs='+' lists), a YAML file with the same
// keys, did-you-mean on typos, and Megatron flags we do not support yet rejected *by name*
// rather than as unknown; a small table gives all of that in one place.
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace YAML {
class Node;
}

namespace mt {

// The values an integer flag accepts; anything outside is "--flag: value out of range". Every
// count flag gets one so a number never wraps or narrows silently later (an int cast, a product).
struct IntRange {
  int64_t lo = INT64_MIN;
  int64_t hi = INT64_MAX;
};

class FlagParser {
 public:
  explicit FlagParser(std::string command) : command_(std::move(command)) {}

  void store_true(const std::string& name, bool* target, const std::string& help);
  void store_false(const std::string& name, bool* target, const std::string& help);
  void value(const std::string& name, int64_t* target, const std::string& help, IntRange range = {});
  void value(const std::string& name, uint64_t* target, const std::string& help);
  // Numbers must be finite (no flag here means anything by inf or nan) and, for float targets,
  // representable as a float.
  void value(const std::string& name, double* target, const std::string& help);
  void value(const std::string& name, float* target, const std::string& help);
  void value(const std::string& name, std::string* target, const std::string& help,
             std::vector<std::string> choices = {});
  void list(const std::string& name, std::vector<std::string>* target, const std::string& help);
  // A list flag with its own handler (no current value: custom_list flags are not in current_values()).
  void custom_list(const std::string& name, std::function<void(const std::vector<std::string>&)> fn,
                   const std::string& help);
  // A flag with its own handler; `takes_value` false for switches.
  void custom(const std::string& name, bool takes_value, std::function<void(const std::string&)> fn,
              const std::string& help);
  // A flag accepted with no effect (megatron_flags.def's NOOP entries): a switch, one value or a list.
  void ignored(const std::string& name, bool takes_value, bool is_list, const std::string& help);
  // A Megatron-LM flag that megatron.cpp does not support yet: rejected by name with `why`.
  void unsupported(const std::string& name, const std::string& why);
  // Flags registered from here on are listed under `title` in --help (Megatron's argument groups).
  void group(const std::string& title) { group_ = title; }
  bool registered(const std::string& name) const { return flags_.count(name) != 0; }
  bool rejected(const std::string& name) const { return unsupported_.count(name) != 0; }
  const std::vector<std::string>& registered_names() const { return order_; }
  // The current value of every flag bound to a field (custom and ignored flags have none), in
  // registration order: switches as {"true"} / {"false"} (whether the switch is in effect),
  // values as their shortest text, lists as their items. What --print-config prints and a
  // checkpoint records.
  struct Current {
    std::string name, group;
    bool is_switch = false, is_list = false;
    std::vector<std::string> values;
  };
  std::vector<Current> current_values() const;

  // Parses argv; records the names given. `--config FILE.yaml` (if registered via
  // enable_config) is applied first, then the command line overrides it.
  void parse(const std::vector<std::string>& argv);
  void enable_config() { config_enabled_ = true; }
  bool given(const std::string& name) const;
  const std::vector<std::string>& given_names() const { return given_; }
  std::string help() const;
  bool help_requested() const { return help_; }

 private:
  struct Flag {
    std::string name;
    bool takes_value = true;
    bool is_list = false;
    std::function<void(const std::string&)> set;
    std::function<void(const std::vector<std::string>&)> set_list;
    std::string help;
    std::string group;
    std::string default_text;  // the target's value at registration, shown by --help
    std::function<std::vector<std::string>()> get;  // the target's current value (bound flags only)
  };
  Flag& add(const std::string& name, const std::string& help);
  void apply(const Flag& f, const std::vector<std::string>& values, const std::string& source);
  void apply_yaml(const std::string& path);
  void apply_yaml_entry(const YAML::Node& key, const YAML::Node& value, const std::string& source);
  [[noreturn]] void unknown(const std::string& name, const std::string& source) const;

  static constexpr uint64_t kMaxConfigBytes = 16u << 20;

  std::string command_;
  std::string group_;
  std::map<std::string, Flag> flags_;
  std::vector<std::string> order_;
  std::map<std::string, std::string> unsupported_;
  std::vector<std::string> given_;
  bool config_enabled_ = false;
  bool help_ = false;
};

}  // namespace mt
