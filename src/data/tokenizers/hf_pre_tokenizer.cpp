#include "data/tokenizers/hf_pre_tokenizer.h"

#include <functional>

#include "data/tokenizers/gpt2_bpe_tokenizer.h"
#include "data/tokenizers/hf_pattern.h"
#include "data/tokenizers/regex.h"

namespace mt::data::hf {

namespace {

using MatchFn = std::function<void(std::string_view, const std::function<void(size_t, size_t)>&)>;

struct Segment {
  size_t begin, end;
  bool match;
};

// Splits every piece at the matches of `find`, keeping the pieces `behavior` asks for (the
// rules of HF tokenizers' NormalizedString::split).
void split_pieces(PreTokenized& pt, const MatchFn& find, Behavior behavior, bool invert) {
  std::vector<Piece> out;
  out.reserve(pt.pieces.size() * 2);
  std::vector<Segment> segs;
  std::vector<Segment> merged;
  for (const Piece& p : pt.pieces) {
    const std::string_view text = std::string_view(pt.buf).substr(p.begin, p.end - p.begin);
    segs.clear();
    size_t prev = 0;
    find(text, [&](size_t b, size_t e) {
      if (b > prev) segs.push_back({prev, b, false});
      segs.push_back({b, e, true});
      prev = e;
    });
    if (prev < text.size()) segs.push_back({prev, text.size(), false});
    if (invert) {
      for (auto& s : segs) s.match = !s.match;
    }
    merged.clear();
    switch (behavior) {
      case Behavior::Removed:
        for (const auto& s : segs) {
          if (!s.match) merged.push_back(s);
        }
        break;
      case Behavior::Isolated:
        merged = segs;
        break;
      case Behavior::MergedWithPrevious: {
        bool prev_match = false;
        for (const auto& s : segs) {
          if (s.match && !prev_match && !merged.empty()) {
            merged.back().end = s.end;
          } else {
            merged.push_back(s);
          }
          prev_match = s.match;
        }
        break;
      }
      case Behavior::MergedWithNext: {
        bool prev_match = false;
        for (size_t k = segs.size(); k-- > 0;) {
          const auto& s = segs[k];
          if (s.match && !prev_match && !merged.empty()) {
            merged.back().begin = s.begin;
          } else {
            merged.push_back(s);
          }
          prev_match = s.match;
        }
        std::reverse(merged.begin(), merged.end());
        break;
      }
      case Behavior::Contiguous: {
        bool prev_match = false;
        for (const auto& s : segs) {
          if (s.match && prev_match && !merged.empty()) {
            merged.back().end = s.end;
          } else {
            merged.push_back(s);
          }
          prev_match = s.match;
        }
        break;
      }
    }
    for (const auto& s : merged) {
      if (s.end > s.begin) out.push_back({p.begin + s.begin, p.begin + s.end});
    }
  }
  pt.pieces = std::move(out);
}

MatchFn regex_matcher(std::shared_ptr<Regex> re) {
  return [re](std::string_view text, const std::function<void(size_t, size_t)>& fn) {
    re->for_each_match(text, fn);
  };
}

Behavior parse_behavior(const nlohmann::json& j, const Where& w, Behavior def) {
  const std::string b = get_string(j, "behavior", w);
  if (b.empty()) return def;
  if (b == "Removed") return Behavior::Removed;
  if (b == "Isolated") return Behavior::Isolated;
  if (b == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::MergedWithNext;
  if (b == "Contiguous") return Behavior::Contiguous;
  bad(w, "unknown split behavior '" + b + "'");
}

// Any pre-tokenizer that only splits by a matcher.
class SplitBy final : public PreTokenizer {
 public:
  SplitBy(MatchFn find, Behavior b, bool invert) : find_(std::move(find)), b_(b), invert_(invert) {}
  void apply(PreTokenized& pt) const override { split_pieces(pt, find_, b_, invert_); }

 private:
  MatchFn find_;
  Behavior b_;
  bool invert_;
};

class Sequence final : public PreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void apply(PreTokenized& pt) const override {
    for (const auto& p : parts_) p->apply(pt);
  }
  bool byte_level() const override { return !parts_.empty() && parts_.back()->byte_level(); }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

// Rebuilds the buffer with each piece passed through `edit`.
template <typename Edit>
void rewrite_pieces(PreTokenized& pt, Edit&& edit) {
  std::string buf;
  buf.reserve(pt.buf.size() + pt.pieces.size() * 3);
  std::vector<Piece> pieces;
  pieces.reserve(pt.pieces.size());
  for (size_t i = 0; i < pt.pieces.size(); ++i) {
    const size_t b = buf.size();
    edit(i, pt.piece(i), buf);
    pieces.push_back({b, buf.size()});
  }
  pt.buf = std::move(buf);
  pt.pieces = std::move(pieces);
}

class ByteLevel final : public PreTokenizer {
 public:
  ByteLevel(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space),
        re_(use_regex ? std::make_shared<Regex>(kGpt2Pattern, "ByteLevel") : nullptr) {}
  void apply(PreTokenized& pt) const override {
    if (add_prefix_space_) {
      rewrite_pieces(pt, [](size_t, std::string_view p, std::string& out) {
        if (!p.starts_with(' ')) out.push_back(' ');
        out.append(p);
      });
    }
    if (re_) split_pieces(pt, regex_matcher(re_), Behavior::Isolated, false);
  }
  bool byte_level() const override { return true; }

 private:
  bool add_prefix_space_;
  std::shared_ptr<Regex> re_;
};

class Metaspace final : public PreTokenizer {
 public:
  enum class Prepend { Always, First, Never };
  Metaspace(std::string replacement, Prepend scheme, bool split)
      : rep_(std::move(replacement)), scheme_(scheme), split_(split) {}
  void apply(PreTokenized& pt) const override {
    rewrite_pieces(pt, [&](size_t i, std::string_view p, std::string& out) {
      const bool prepend = !p.starts_with(rep_) && !p.starts_with(' ') &&
                           (scheme_ == Prepend::Always ||
                            (scheme_ == Prepend::First && i == 0 && pt.first_section));
      if (prepend) out.append(rep_);
      for (char c : p) {
        if (c == ' ') {
          out.append(rep_);
        } else {
          out.push_back(c);
        }
      }
    });
    if (split_) {
      const std::string rep = rep_;
      split_pieces(
          pt,
          [rep](std::string_view text, const std::function<void(size_t, size_t)>& fn) {
            for (size_t pos = text.find(rep); pos != std::string_view::npos;
                 pos = text.find(rep, pos + rep.size())) {
              fn(pos, pos + rep.size());
            }
          },
          Behavior::MergedWithNext, false);
    }
  }

 private:
  std::string rep_;
  Prepend scheme_;
  bool split_;
};

std::unique_ptr<PreTokenizer> split_regex(const char* re, Behavior b, bool invert,
                                          const char* what) {
  return std::make_unique<SplitBy>(regex_matcher(std::make_shared<Regex>(re, what)), b, invert);
}

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j, const Where& w) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, w);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    const auto& list = get_array(j, "pretokenizers", w);
    for (size_t i = 0; i < list.size(); ++i) {
      const Where wi = w.child(".pretokenizers").index(i);
      auto p = make_pre_tokenizer(list[i], wi);
      if (!p) continue;
      if (!parts.empty() && parts.back()->byte_level()) {
        bad(wi, "a pre-tokenizer after ByteLevel is not supported");
      }
      parts.push_back(std::move(p));
    }
    return std::make_unique<Sequence>(std::move(parts));
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevel>(get_bool(j, "add_prefix_space", w, true),
                                       get_bool(j, "use_regex", w, true));
  }
  if (type == "Split") {
    if (!j.contains("pattern")) bad(w, "Split needs a pattern");
    auto pattern = std::make_shared<Pattern>(j["pattern"], w.child(".pattern"));
    MatchFn find = [pattern](std::string_view text,
                             const std::function<void(size_t, size_t)>& fn) {
      pattern->for_each_match(text, fn);
    };
    return std::make_unique<SplitBy>(std::move(find),
                                     parse_behavior(j, w, Behavior::Isolated),
                                     get_bool(j, "invert", w, false));
  }
  if (type == "Metaspace") {
    std::string rep = get_string(j, "replacement", w, "\xE2\x96\x81");
    if (rep.empty()) bad(w, "Metaspace replacement must not be empty");
    Metaspace::Prepend scheme = get_bool(j, "add_prefix_space", w, true)
                                    ? Metaspace::Prepend::Always
                                    : Metaspace::Prepend::Never;
    const std::string s = get_string(j, "prepend_scheme", w);
    if (s == "always") scheme = Metaspace::Prepend::Always;
    else if (s == "first") scheme = Metaspace::Prepend::First;
    else if (s == "never") scheme = Metaspace::Prepend::Never;
    else if (!s.empty()) bad(w, "unknown prepend_scheme '" + s + "'");
    return std::make_unique<Metaspace>(rep, scheme, get_bool(j, "split", w, true));
  }
  if (type == "Digits") {
    // Rust's char::is_numeric: the N categories.
    return get_bool(j, "individual_digits", w, false)
               ? split_regex("\\p{N}", Behavior::Isolated, false, "Digits")
               : split_regex("\\p{N}+", Behavior::Isolated, false, "Digits");
  }
  if (type == "Whitespace") {
    return split_regex("\\w+|[^\\w\\s]+", Behavior::Removed, true, "Whitespace");
  }
  if (type == "WhitespaceSplit") {
    return split_regex("\\s+", Behavior::Removed, false, "WhitespaceSplit");
  }
  if (type == "Punctuation" || type == "BertPreTokenizer") {
    // ASCII punctuation (including symbols such as $ + < = > ^ ` | ~) and Unicode P*.
    const char* punct = "[\\p{P}!-/:-@\\[-`{-~]";
    auto p = split_regex(punct, type == "Punctuation" ? parse_behavior(j, w, Behavior::Isolated)
                                                      : Behavior::Isolated,
                         false, "Punctuation");
    if (type == "Punctuation") return p;
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    parts.push_back(split_regex("\\s+", Behavior::Removed, false, "BertPreTokenizer"));
    parts.push_back(std::move(p));
    return std::make_unique<Sequence>(std::move(parts));
  }
  if (type == "CharDelimiterSplit") {
    const std::string d = get_string(j, "delimiter", w);
    if (d.empty()) bad(w, "CharDelimiterSplit needs a delimiter");
    auto re = std::make_shared<Regex>(escape_literal(d), "CharDelimiterSplit");
    return std::make_unique<SplitBy>(regex_matcher(re), Behavior::Removed, false);
  }
  bad(w, "pre-tokenizer type '" + type +
             "' is not supported (supported: Sequence, ByteLevel, Split, Metaspace, Digits, "
             "Whitespace, WhitespaceSplit, Punctuation, BertPreTokenizer, CharDelimiterSplit)");
}

}  // namespace mt::data::hf
