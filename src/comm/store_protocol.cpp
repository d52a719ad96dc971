#include "comm/store_protocol.h"

#include <climits>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace mt::comm {

namespace {
constexpr size_t kHeader = 4;        // the u32 length prefix
constexpr size_t kRequestHead = 5;   // op + key length
constexpr size_t kKeepCapacity = size_t{1} << 20;  // buffer memory an idle connection may keep

uint32_t read_u32(const char* p) {
  uint32_t v = 0;
  std::memcpy(&v, p, 4);
  return v;
}

void append_u32(std::string& s, uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); }
}  // namespace

std::string encode_store_request(uint8_t op, std::string_view key, std::string_view value) {
  const size_t body = kRequestHead + key.size() + value.size();
  MT_CHECK(body <= StoreLimits::kMaxMessage, "a rendezvous store request of {} bytes (key '{}') is over the {} byte limit",
           body, key.substr(0, 64), StoreLimits::kMaxMessage);
  std::string msg;
  msg.reserve(kHeader + body);
  append_u32(msg, static_cast<uint32_t>(body));
  msg.push_back(static_cast<char>(op));
  append_u32(msg, static_cast<uint32_t>(key.size()));
  msg += key;
  msg += value;
  return msg;
}

std::string store_i64_bytes(int64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }

int64_t store_bytes_i64(std::string_view s) {
  int64_t v = 0;
  std::memcpy(&v, s.data(), std::min<size_t>(8, s.size()));
  return v;
}

bool secrets_equal(std::string_view a, std::string_view b) {
  // Compare every byte of the longer one whatever the first difference, so the time a refusal
  // takes tells nothing about how much of a guess was right.
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = static_cast<unsigned char>(diff | (x ^ y));
  }
  return diff == 0;
}

StoreState::StoreState(std::string secret, StoreLimits limits) : secret_(std::move(secret)), limits_(limits) {
  MT_CHECK(!secret_.empty(), "the rendezvous store needs a secret");
}

StoreState::Conn& StoreState::conn(int id) {
  auto it = conns_.find(id);
  MT_CHECK(it != conns_.end(), "unknown store connection {}", id);
  return it->second;
}

const StoreState::Conn& StoreState::conn(int id) const {
  auto it = conns_.find(id);
  MT_CHECK(it != conns_.end(), "unknown store connection {}", id);
  return it->second;
}

void StoreState::open(int id) {
  MT_CHECK(!conns_.count(id), "store connection {} opened twice", id);
  conns_.emplace(id, Conn{});
}

void StoreState::close(int id) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  Conn& c = it->second;
  if (c.rank >= 0 && !c.bye && lost_.size() < limits_.max_lost) lost_.push_back(c.rank);
  if (c.parked) {
    auto p = parked_.find(c.parked_key);
    if (p != parked_.end()) {
      p->second.erase(id);
      if (p->second.empty()) parked_.erase(p);
    }
  }
  conns_.erase(it);
}

StoreState::Next StoreState::next_request(const Conn& c) const {
  const size_t avail = c.in.size() - c.in_off;
  if (avail == 0) return Next::kNone;
  if (avail < kHeader) return Next::kPartial;
  const size_t len = read_u32(c.in.data() + c.in_off);
  // Checked as soon as the prefix arrives, before waiting for (and buffering) the body.
  const size_t limit = c.authed ? limits_.max_message : limits_.max_auth_message;
  if (len < kRequestHead || len > limit) return Next::kBad;
  return avail - kHeader < len ? Next::kPartial : Next::kWhole;
}

StoreState::Step StoreState::receive(int id, const char* data, size_t n) {
  Conn& c = conn(id);
  c.in.append(data, n);
  if (next_request(c) == Next::kBad) return Step::kClose;
  return process(id);
}

StoreState::Step StoreState::process(int id) {
  Conn& c = conn(id);
  Step step = Step::kIdle;
  while (!c.parked && c.out.size() - c.out_off < limits_.max_output) {
    const Next next = next_request(c);
    if (next == Next::kBad) return Step::kClose;
    if (next != Next::kWhole) break;
    const char* p = c.in.data() + c.in_off;
    const size_t len = read_u32(p);
    const uint8_t op = static_cast<uint8_t>(p[kHeader]);
    const size_t klen = read_u32(p + kHeader + 1);
    if (klen > len - kRequestHead) return Step::kClose;
    // Views into `in`: handling writes output buffers and the table, never `in`.
    const std::string_view key(p + kHeader + kRequestHead, klen);
    const std::string_view value(p + kHeader + kRequestHead + klen, len - kRequestHead - klen);
    c.in_off += kHeader + len;
    if (handle(id, c, op, key, value) == Step::kClose) return Step::kClose;
    step = Step::kProgress;
  }
  if (c.in_off == c.in.size()) {
    c.in.clear();
    c.in_off = 0;
    if (c.in.capacity() > kKeepCapacity) c.in.shrink_to_fit();  // after a large SET
  } else if (c.in_off > 0) {
    c.in.erase(0, c.in_off);
    c.in_off = 0;
  }
  // A new partial request: its length must already be within the limit.
  if (next_request(c) == Next::kBad) return Step::kClose;
  return step;
}

void StoreState::reply(Conn& c, std::string_view payload) {
  append_u32(c.out, static_cast<uint32_t>(payload.size()));
  c.out += payload;
}

void StoreState::wake_waiters(const std::string& key) {
  auto p = parked_.find(key);
  if (p == parked_.end()) return;
  const std::string& value = kv_[key];
  for (int id : p->second) {
    Conn& w = conn(id);
    reply(w, value);
    w.parked = false;
    w.parked_key.clear();
  }
  parked_.erase(p);
}

StoreState::Step StoreState::handle(int id, Conn& c, uint8_t op, std::string_view key, std::string_view value) {
  if (!c.authed) {
    if (op != kStoreAuth) return Step::kClose;
    if (!secrets_equal(value, secret_)) {
      reply(c, "0");
      return Step::kClose;
    }
    c.authed = true;
    reply(c, "1");
    return Step::kProgress;
  }
  switch (op) {
    case kStoreAuth: reply(c, "1"); break;
    case kStoreSet: {
      const std::string k(key);
      kv_[k] = std::string(value);
      reply(c, "");
      wake_waiters(k);
      break;
    }
    case kStoreGet: {
      auto it = kv_.find(std::string(key));
      if (it != kv_.end()) {
        reply(c, it->second);
      } else {
        c.parked = true;
        c.parked_key = std::string(key);
        parked_[c.parked_key].insert(id);
      }
      break;
    }
    case kStoreAdd: {
      if (value.size() != 8) return Step::kClose;
      const std::string k(key);
      auto it = kv_.find(k);
      if (it != kv_.end() && it->second.size() != 8) return Step::kClose;  // not a counter
      const uint64_t old = it == kv_.end() ? 0 : static_cast<uint64_t>(store_bytes_i64(it->second));
      // Two's-complement wrap-around instead of signed overflow (undefined behaviour).
      const uint64_t sum = old + static_cast<uint64_t>(store_bytes_i64(value));
      std::string& v = kv_[k];
      v = store_i64_bytes(static_cast<int64_t>(sum));
      reply(c, v);
      wake_waiters(k);
      break;
    }
    case kStoreCheck: reply(c, kv_.count(std::string(key)) ? "1" : "0"); break;
    case kStoreHello: {
      if (value.size() != 8) return Step::kClose;
      const int64_t rank = store_bytes_i64(value);
      if (rank < 0 || rank > INT_MAX) return Step::kClose;
      c.rank = static_cast<int>(rank);
      reply(c, "");
      break;
    }
    case kStoreBye:
      c.bye = true;
      reply(c, "");
      break;
    case kStoreLost: {
      std::string out;
      for (int r : lost_) out += store_i64_bytes(r);
      reply(c, out);
      break;
    }
    default: return Step::kClose;
  }
  return Step::kProgress;
}

std::string_view StoreState::pending_output(int id) const {
  const Conn& c = conn(id);
  return std::string_view(c.out).substr(c.out_off);
}

void StoreState::consume_output(int id, size_t n) {
  Conn& c = conn(id);
  MT_CHECK(n <= c.out.size() - c.out_off, "consumed more store output than was pending");
  c.out_off += n;
  if (c.out_off == c.out.size()) {
    c.out.clear();
    c.out_off = 0;
    if (c.out.capacity() > kKeepCapacity) c.out.shrink_to_fit();
  } else if (c.out_off > kKeepCapacity && c.out_off > c.out.size() / 2) {
    // Compact now and then rather than after every partial send (which would copy the rest each time).
    c.out.erase(0, c.out_off);
    c.out_off = 0;
  }
}

bool StoreState::wants_input(int id) const {
  const Conn& c = conn(id);
  const Next next = next_request(c);
  return next != Next::kWhole && next != Next::kBad && c.out.size() - c.out_off < limits_.max_output;
}

bool StoreState::authenticated(int id) const { return conn(id).authed; }

bool StoreState::mid_request(int id) const { return next_request(conn(id)) == Next::kPartial; }

size_t StoreState::buffered_bytes(int id) const {
  const Conn& c = conn(id);
  return c.in.capacity() + c.out.capacity();
}

}  // namespace mt::comm
