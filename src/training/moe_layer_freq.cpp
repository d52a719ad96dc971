#include "training/moe_layer_freq.h"

#include <cctype>

#include "core/error.h"
#include "model/config.h"

namespace mt {
namespace {

// Far above any layer count; keeps products of literals far from int64 overflow.
constexpr int64_t kMaxNumber = int64_t{1} << 32;
constexpr int kMaxDepth = 64;  // parentheses and brackets: bounds the recursion

// A value of the expression: an integer or a list of integers (Python's int and list).
struct Value {
  bool is_list = false;
  int64_t n = 0;
  std::vector<int64_t> items;
};

class Parser {
 public:
  Parser(const std::string& text, const std::string& flag) : s_(text), flag_(flag) {}

  Value parse() {
    Value v = sum(0);
    skip_space();
    if (i_ < s_.size()) error(fmt::format("unexpected '{}'", s_[i_]));
    return v;
  }

  [[noreturn]] void error(const std::string& what) const { error_at(what, i_); }
  [[noreturn]] void error_at(const std::string& what, size_t pos) const {
    fail("{}: {} at position {} in '{}' (expected an integer N, or a list expression of 0s and 1s such as "
         "'([1]*3+[0]*1)*3')",
         flag_, what, pos + 1, s_);
  }

 private:
  void skip_space() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool eat(char c) {
    skip_space();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }

  // sum := product ('+' product)*
  Value sum(int depth) {
    Value v = product(depth);
    for (;;) {
      const size_t at = (skip_space(), i_);
      if (!eat('+')) return v;
      Value r = product(depth);
      if (v.is_list != r.is_list) error_at("cannot add a list and an integer", at);
      if (v.is_list) {
        if (v.items.size() + r.items.size() > static_cast<size_t>(model::limits::kLayers)) too_long(at);
        v.items.insert(v.items.end(), r.items.begin(), r.items.end());
      } else {
        v.n += r.n;
        if (v.n > kMaxNumber) error_at("the number is too large", at);
      }
    }
  }

  // product := atom ('*' atom)*; list * int and int * list repeat the list, as in Python.
  Value product(int depth) {
    Value v = atom(depth);
    for (;;) {
      const size_t at = (skip_space(), i_);
      if (!eat('*')) return v;
      Value r = atom(depth);
      if (v.is_list && r.is_list) error_at("cannot multiply two lists", at);
      if (!v.is_list && !r.is_list) {
        if (__builtin_mul_overflow(v.n, r.n, &v.n) || v.n > kMaxNumber) error_at("the number is too large", at);
        continue;
      }
      const Value& list = v.is_list ? v : r;
      const int64_t times = v.is_list ? r.n : v.n;
      if (!list.items.empty() && times > model::limits::kLayers / static_cast<int64_t>(list.items.size()))
        too_long(at);
      std::vector<int64_t> out;
      out.reserve(list.items.size() * static_cast<size_t>(times));
      // An empty list stays empty however often it repeats (4294967296*[] must not loop).
      for (int64_t k = 0; k < times && !list.items.empty(); ++k)
        out.insert(out.end(), list.items.begin(), list.items.end());
      v.is_list = true;
      v.items = std::move(out);
    }
  }

  // atom := INTEGER | '(' sum ')' | '[' [sum (',' sum)* [',']] ']'
  Value atom(int depth) {
    skip_space();
    if (depth > kMaxDepth) error("the expression nests too deeply");
    if (i_ >= s_.size()) error("the expression ends early");
    const char c = s_[i_];
    if (std::isdigit(static_cast<unsigned char>(c))) return number();
    if (eat('(')) {
      Value v = sum(depth + 1);
      if (!eat(')')) error("expected ')'");
      return v;
    }
    if (eat('[')) {
      Value v;
      v.is_list = true;
      while (!eat(']')) {
        const size_t at = (skip_space(), i_);
        Value e = sum(depth + 1);
        if (e.is_list) error_at("list entries must be integers, not lists", at);
        if (v.items.size() >= static_cast<size_t>(model::limits::kLayers)) too_long(at);
        v.items.push_back(e.n);
        if (!eat(',')) {
          if (!eat(']')) error("expected ',' or ']'");
          break;
        }
      }
      return v;
    }
    error(fmt::format("unexpected '{}'", c));
  }

  Value number() {
    const size_t at = i_;
    Value v;
    while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) {
      v.n = v.n * 10 + (s_[i_] - '0');
      if (v.n > kMaxNumber) error_at("the number is too large", at);
      ++i_;
    }
    return v;
  }

  [[noreturn]] void too_long(size_t at) const {
    error_at(fmt::format("the pattern would have more than {} entries", model::limits::kLayers), at);
  }

  const std::string& s_;
  const std::string& flag_;
  size_t i_ = 0;
};

}  // namespace

MoELayerFreq parse_moe_layer_freq(const std::string& text, const std::string& flag) {
  Parser p(text, flag);
  const Value v = p.parse();
  MoELayerFreq f;
  if (!v.is_list) {
    if (v.n < 1) fail("{}: the frequency must be at least 1 (got '{}')", flag, text);
    f.every = v.n;
    return f;
  }
  if (v.items.empty()) fail("{}: the pattern '{}' is empty; give one 0 or 1 per layer", flag, text);
  for (size_t k = 0; k < v.items.size(); ++k) {
    if (v.items[k] > 1)
      fail("{}: entry {} of the pattern '{}' is {}; entries must be 0 (dense) or 1 (MoE)", flag, k, text, v.items[k]);
    f.pattern.push_back(v.items[k] == 1);
  }
  return f;
}

std::vector<bool> moe_layer_pattern(const MoELayerFreq& f, int64_t num_layers, const std::string& flag) {
  if (!f.pattern.empty()) {
    if (static_cast<int64_t>(f.pattern.size()) != num_layers)
      fail("{}: the pattern has {} entries but the model has {} layers (--num-layers); give one per layer", flag,
           f.pattern.size(), num_layers);
    return f.pattern;
  }
  if (f.every == 1) return {};
  std::vector<bool> p(static_cast<size_t>(num_layers));
  for (int64_t l = 0; l < num_layers; ++l) p[static_cast<size_t>(l)] = l % f.every == 0;
  return p;
}

}  // namespace mt
