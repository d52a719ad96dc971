#include "data/tokenizers/hf_normalizer.h"

#include <vector>

#include "data/tokenizers/hf_pattern.h"
#include "data/tokenizers/unicode_norm.h"
#include "data/tokenizers/utf8.h"

namespace mt::data::hf {

namespace {

class Sequence final : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  void normalize(std::string& s) const override {
    for (const auto& p : parts_) p->normalize(s);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

class Unicode final : public Normalizer {
 public:
  explicit Unicode(NormForm f) : form_(f) {}
  void normalize(std::string& s) const override { s = unicode_normalize(s, form_); }

 private:
  NormForm form_;
};

class Lowercase final : public Normalizer {
 public:
  void normalize(std::string& s) const override { s = unicode_lowercase(s); }
};

// White_Space, the set Rust's char::is_whitespace uses.
bool is_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

class Strip final : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& s) const override;

 private:
  bool left_, right_;
};

class Prepend final : public Normalizer {
 public:
  explicit Prepend(std::string p) : prepend_(std::move(p)) {}
  void normalize(std::string& s) const override {
    if (!s.empty()) s.insert(0, prepend_);  // HF leaves empty text alone
  }

 private:
  std::string prepend_;
};

class Replace final : public Normalizer {
 public:
  Replace(const nlohmann::json& pattern, std::string content, const Where& w)
      : pattern_(pattern, w), content_(std::move(content)) {}
  void normalize(std::string& s) const override { s = pattern_.replace_all(s, content_); }

 private:
  Pattern pattern_;
  std::string content_;
};

class StripAccents final : public Normalizer {
 public:
  StripAccents() : marks_("\\p{M}", "StripAccents") {}
  void normalize(std::string& s) const override { s = marks_.replace_all(s, ""); }

 private:
  Regex marks_;
};

}  // namespace

void Strip::normalize(std::string& s) const {
  // Byte offsets of the first and one-past-last non-space characters.
  size_t begin = s.size(), end = 0;
  for (size_t i = 0; i < s.size();) {
    const size_t at = i;
    if (!is_space(utf8::next(s, i))) {
      if (begin == s.size()) begin = at;
      end = i;
    }
  }
  if (begin == s.size()) {  // all spaces
    if (left_ || right_) s.clear();
    return;
  }
  if (!right_) end = s.size();
  if (!left_) begin = 0;
  s = s.substr(begin, end - begin);
}

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const Where& w) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, w);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> parts;
    const auto& list = get_array(j, "normalizers", w);
    for (size_t i = 0; i < list.size(); ++i) {
      auto p = make_normalizer(list[i], w.child(".normalizers").index(i));
      if (p) parts.push_back(std::move(p));
    }
    return std::make_unique<Sequence>(std::move(parts));
  }
  if (type == "NFC") return std::make_unique<Unicode>(NormForm::NFC);
  if (type == "NFD") return std::make_unique<Unicode>(NormForm::NFD);
  if (type == "NFKC") return std::make_unique<Unicode>(NormForm::NFKC);
  if (type == "NFKD") return std::make_unique<Unicode>(NormForm::NFKD);
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "StripAccents") return std::make_unique<StripAccents>();
  if (type == "Strip") {
    return std::make_unique<Strip>(get_bool(j, "strip_left", w, true),
                                   get_bool(j, "strip_right", w, true));
  }
  if (type == "Prepend") return std::make_unique<Prepend>(get_string(j, "prepend", w));
  if (type == "Replace") {
    if (!j.contains("pattern")) bad(w, "Replace needs a pattern");
    return std::make_unique<Replace>(j["pattern"], get_string(j, "content", w), w);
  }
  bad(w, "normalizer type '" + type +
             "' is not supported (supported: Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Strip, "
             "StripAccents, Prepend, Replace)");
}

}  // namespace mt::data::hf
