#include "data/tokenizers/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"
#include "data/tokenizers/utf8.h"

namespace mt::data {

namespace {

// White_Space: what \s means in Oniguruma and in Python's regex module.
constexpr const char* kSpaceSet = "\\t-\\r\\x{85}\\p{Z}";
constexpr const char* kWordSet = "\\p{L}\\p{M}\\p{Nd}\\p{Pc}";

// Per-thread match data: one ovector pair is enough because only the whole match is used.
pcre2_match_data* thread_match_data() {
  struct Holder {
    pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
    ~Holder() { pcre2_match_data_free(md); }
  };
  thread_local Holder h;
  return h.md;
}

}  // namespace

std::string translate_pattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 32);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[i + 1];
      ++i;
      auto emit = [&](const char* set, bool negate) {
        if (in_class) {
          out += set;
        } else {
          out += negate ? "[^" : "[";
          out += set;
          out += "]";
        }
      };
      switch (n) {
        case 's': emit(kSpaceSet, false); continue;
        case 'w': emit(kWordSet, false); continue;
        case 'd': out += "\\p{Nd}"; continue;
        case 'D': out += "\\P{Nd}"; continue;
        // A negated set cannot be spliced into a class; PCRE2's own meaning is nearly the same.
        case 'S': if (!in_class) { emit(kSpaceSet, true); continue; } break;
        case 'W': if (!in_class) { emit(kWordSet, true); continue; } break;
        default: break;
      }
      out += '\\';
      out += n;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

std::string escape_literal(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}-/#&~ ").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

Regex::Regex(std::string_view pattern, std::string_view what) : source_(pattern) {
  const std::string translated = translate_pattern(pattern);
  int err = 0;
  PCRE2_SIZE err_off = 0;
  auto* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                             PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &err_off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    fail("{}: cannot compile regex '{}' at offset {}: {}; fix or remove that pattern", what,
         source_, err_off, reinterpret_cast<const char*>(msg));
  }
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  code_ = code;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

bool Regex::find(std::string_view text, size_t from, size_t& begin, size_t& end) const {
  auto* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* md = thread_match_data();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  uint32_t opts = PCRE2_NO_UTF_CHECK;
  while (from <= text.size()) {
    int rc = jit_ ? pcre2_jit_match(code, subject, text.size(), from, opts, md, nullptr)
                  : pcre2_match(code, subject, text.size(), from, opts, md, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      // Very long runs can exhaust the JIT's default stack; the interpreter uses the heap.
      rc = pcre2_match(code, subject, text.size(), from, opts | PCRE2_NO_JIT, md, nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof(msg));
      fail("regex '{}' failed while matching: {}", source_, reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    if (ov[1] > ov[0]) {
      begin = ov[0];
      end = ov[1];
      return true;
    }
    // An empty match: look again one character further on.
    if (ov[0] >= text.size()) return false;
    from = ov[0] + utf8::char_len(static_cast<unsigned char>(text[ov[0]]));
  }
  return false;
}

std::string Regex::replace_all(std::string_view text, std::string_view with) const {
  std::string out;
  size_t last = 0;
  for_each_match(text, [&](size_t b, size_t e) {
    out.append(text.substr(last, b - last));
    out.append(with);
    last = e;
  });
  out.append(text.substr(last));
  return out;
}

}  // namespace mt::data
