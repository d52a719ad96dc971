#include "training/tb_event_codec.h"

#include <cstring>

#include "core/error.h"

namespace mt::tb {
namespace {

enum Wire : uint32_t { kVarint = 0, kFixed64 = 1, kBytes = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_key(std::string& out, uint32_t field, Wire w) { put_varint(out, (field << 3) | w); }
void put_bytes(std::string& out, uint32_t field, std::string_view b) {
  put_key(out, field, kBytes);
  put_varint(out, b.size());
  out.append(b);
}
template <typename T>
void put_fixed(std::string& out, uint32_t field, T v) {
  put_key(out, field, sizeof(T) == 8 ? kFixed64 : kFixed32);
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian hosts only (x86-64, aarch64), as the project
  out.append(b, sizeof(T));
}

// A bounds-checked reader over one message's bytes.
struct Reader {
  std::string_view b;
  const std::string& what;
  size_t at = 0;

  bool done() const { return at >= b.size(); }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (at >= b.size()) fail("{}: truncated varint", what);
      const auto c = static_cast<uint8_t>(b[at++]);
      v |= static_cast<uint64_t>(c & 0x7f) << shift;
      if (!(c & 0x80)) return v;
    }
    fail("{}: varint longer than 10 bytes", what);
  }
  std::string_view take(uint64_t n) {
    if (n > b.size() - at) fail("{}: a field of {} bytes runs past the end of its message", what, n);
    const std::string_view s = b.substr(at, static_cast<size_t>(n));
    at += static_cast<size_t>(n);
    return s;
  }
  template <typename T>
  T fixed() {
    T v;
    std::memcpy(&v, take(sizeof(T)).data(), sizeof(T));
    return v;
  }
  void skip(uint32_t wire) {
    switch (wire) {
      case kVarint: (void)varint(); return;
      case kFixed64: (void)take(8); return;
      case kBytes: (void)take(varint()); return;
      case kFixed32: (void)take(4); return;
      default: fail("{}: unsupported wire type {}", what, wire);
    }
  }
};

void expect(uint32_t wire, Wire want, const char* field, const std::string& what) {
  if (wire != want) fail("{}: field {} has wire type {}, expected {}", what, field, wire, static_cast<uint32_t>(want));
}

void decode_value(std::string_view bytes, const std::string& what, Event& e) {
  Reader r{bytes, what};
  Scalar s;
  bool has_value = false;
  while (!r.done()) {
    const uint64_t key = r.varint();
    const auto field = key >> 3;
    const auto wire = static_cast<uint32_t>(key & 7);
    if (field == 1) {
      expect(wire, kBytes, "Summary.Value.tag", what);
      s.tag = std::string(r.take(r.varint()));
    } else if (field == 2) {
      expect(wire, kFixed32, "Summary.Value.simple_value", what);
      s.value = r.fixed<float>();
      has_value = true;
    } else {
      r.skip(wire);
    }
  }
  if (has_value) e.scalars.push_back(std::move(s));
}

void decode_summary(std::string_view bytes, const std::string& what, Event& e) {
  Reader r{bytes, what};
  while (!r.done()) {
    const uint64_t key = r.varint();
    const auto wire = static_cast<uint32_t>(key & 7);
    if ((key >> 3) == 1) {
      expect(wire, kBytes, "Summary.value", what);
      decode_value(r.take(r.varint()), what, e);
    } else {
      r.skip(wire);
    }
  }
}

}  // namespace

std::string encode(const Event& e) {
  std::string out;
  put_fixed<double>(out, 1, e.wall_time);
  if (e.step != 0) {
    put_key(out, 2, kVarint);
    put_varint(out, static_cast<uint64_t>(e.step));  // int64: two's complement, as protobuf
  }
  if (!e.file_version.empty()) put_bytes(out, 3, e.file_version);
  if (!e.scalars.empty()) {
    std::string summary;
    for (const Scalar& s : e.scalars) {
      std::string value;
      put_bytes(value, 1, s.tag);
      put_fixed<float>(value, 2, s.value);
      put_bytes(summary, 1, value);
    }
    put_bytes(out, 5, summary);
  }
  return out;
}

Event decode(std::string_view bytes, const std::string& what) {
  Event e;
  Reader r{bytes, what};
  while (!r.done()) {
    const uint64_t key = r.varint();
    const auto wire = static_cast<uint32_t>(key & 7);
    switch (key >> 3) {
      case 1: expect(wire, kFixed64, "Event.wall_time", what); e.wall_time = r.fixed<double>(); break;
      case 2: expect(wire, kVarint, "Event.step", what); e.step = static_cast<int64_t>(r.varint()); break;
      case 3: expect(wire, kBytes, "Event.file_version", what); e.file_version = std::string(r.take(r.varint())); break;
      case 5: expect(wire, kBytes, "Event.summary", what); decode_summary(r.take(r.varint()), what, e); break;
      default: r.skip(wire);
    }
  }
  return e;
}

}  // namespace mt::tb
