#include "data/tokenizers/hf_decoder.h"

#include "data/tokenizers/byte_level.h"
#include "data/tokenizers/hf_pattern.h"
#include "data/tokenizers/utf8.h"

namespace mt::data::hf {

namespace {

class Sequence final : public Decoder {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  void decode_chain(std::vector<std::string>& t) const override {
    for (const auto& p : parts_) p->decode_chain(t);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

// All tokens to bytes, then one string (invalid UTF-8 replaced). A token holding a character
// outside the byte map (an added token) contributes its own bytes.
class ByteLevel final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& t) const override {
    std::string bytes, raw;
    for (const auto& tok : t) {
      if (byte_level::decode_token(tok, raw)) {
        bytes += raw;
      } else {
        bytes += tok;
      }
    }
    t.assign(1, utf8::sanitize(bytes));
  }
};

class Metaspace final : public Decoder {
 public:
  Metaspace(std::string rep, bool strip_first) : rep_(std::move(rep)), strip_first_(strip_first) {}
  void decode_chain(std::vector<std::string>& t) const override {
    for (size_t i = 0; i < t.size(); ++i) {
      std::string out;
      const std::string& s = t[i];
      for (size_t k = 0; k < s.size();) {
        if (s.compare(k, rep_.size(), rep_) == 0) {
          // HF drops the replacement characters of the first token instead of spacing them.
          if (!(i == 0 && strip_first_)) out.push_back(' ');
          k += rep_.size();
        } else {
          out.push_back(s[k++]);
        }
      }
      t[i] = std::move(out);
    }
  }

 private:
  std::string rep_;
  bool strip_first_;
};

// Runs of <0xXX> tokens become the text they spell; a run that is not valid UTF-8 becomes one
// U+FFFD per byte, as in HF.
class ByteFallback final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& t) const override {
    std::vector<std::string> out;
    std::string bytes;
    size_t nbytes = 0;
    auto flush = [&] {
      if (nbytes == 0) return;
      if (utf8::valid_prefix(bytes) == bytes.size()) {
        out.push_back(bytes);
      } else {
        for (size_t k = 0; k < nbytes; ++k) out.emplace_back("\xEF\xBF\xBD");
      }
      bytes.clear();
      nbytes = 0;
    };
    for (auto& tok : t) {
      int v = -1;
      if (tok.size() == 6 && tok.starts_with("<0x") && tok[5] == '>') v = hex2(tok[3], tok[4]);
      if (v >= 0) {
        bytes.push_back(static_cast<char>(v));
        ++nbytes;
      } else {
        flush();
        out.push_back(std::move(tok));
      }
    }
    flush();
    t = std::move(out);
  }

 private:
  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  }
  static int hex2(char a, char b) {
    const int x = hex(a), y = hex(b);
    return x < 0 || y < 0 ? -1 : x * 16 + y;
  }
};

class Fuse final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& t) const override {
    std::string all;
    for (const auto& s : t) all += s;
    t.assign(1, std::move(all));
  }
};

class Strip final : public Decoder {
 public:
  Strip(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& t) const override {
    const size_t n = content_.size();
    for (auto& s : t) {
      size_t b = 0, e = s.size();
      for (size_t k = 0; k < start_ && n && e - b >= n && s.compare(b, n, content_) == 0; ++k) b += n;
      for (size_t k = 0; k < stop_ && n && e - b >= n && s.compare(e - n, n, content_) == 0; ++k) e -= n;
      s = s.substr(b, e - b);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

class Replace final : public Decoder {
 public:
  Replace(const nlohmann::json& pattern, std::string content, const Where& w)
      : pattern_(pattern, w), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& t) const override {
    for (auto& s : t) s = pattern_.replace_all(s, content_);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

}  // namespace

std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j, const Where& w) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, w);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> parts;
    const auto& list = get_array(j, "decoders", w);
    for (size_t i = 0; i < list.size(); ++i) {
      auto p = make_decoder(list[i], w.child(".decoders").index(i));
      if (p) parts.push_back(std::move(p));
    }
    return std::make_unique<Sequence>(std::move(parts));
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevel>();
  if (type == "ByteFallback") return std::make_unique<ByteFallback>();
  if (type == "Fuse") return std::make_unique<Fuse>();
  if (type == "Metaspace") {
    bool strip = get_bool(j, "add_prefix_space", w, true);
    const std::string s = get_string(j, "prepend_scheme", w);
    if (!s.empty()) strip = s != "never";
    return std::make_unique<Metaspace>(get_string(j, "replacement", w, "\xE2\x96\x81"), strip);
  }
  if (type == "Strip") {
    const int64_t start = get_int(j, "start", w, 0), stop = get_int(j, "stop", w, 0);
    if (start < 0 || stop < 0) bad(w, "Strip start/stop must not be negative");
    return std::make_unique<Strip>(get_string(j, "content", w, " "), static_cast<size_t>(start),
                                   static_cast<size_t>(stop));
  }
  if (type == "Replace") {
    if (!j.contains("pattern")) bad(w, "Replace needs a pattern");
    return std::make_unique<Replace>(j["pattern"], get_string(j, "content", w), w);
  }
  bad(w, "decoder type '" + type +
             "' is not supported (supported: ByteLevel, Metaspace, ByteFallback, Fuse, Strip, "
             "Replace, Sequence)");
}

}  // namespace mt::data::hf
