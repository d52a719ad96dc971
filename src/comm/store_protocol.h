#pragma once
// The rendezvous store's protocol, without sockets: what the server makes of the bytes one
// connection sent and what it queues to send back. TcpStoreServer only moves bytes between its
// sockets and a StoreState; the fuzz target (tests/fuzz/fuzz_store_protocol.cpp) drives the same
// code from a buffer.
//
// Wire format (little-endian):
//   request  = u32 length | u8 op | u32 key length | key | value (the rest of the length)
//   response = u32 length | payload
// A connection's first request must be AUTH carrying the job's secret; the reply is "1", or "0"
// and the connection is closed. Requests of one connection are answered in order; a GET for a
// missing key parks its connection until the key is set (clients bound the wait themselves).
// Every length is checked against StoreLimits before anything is allocated, and a request that
// breaks the format closes its connection: a peer can neither grow the server without bound
// nor desynchronise it.
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace mt::comm {

enum StoreOp : uint8_t {
  kStoreSet = 1,
  kStoreGet = 2,
  kStoreAdd = 3,
  kStoreCheck = 4,
  kStoreHello = 5,  // registers the connection as a rank (value: i64), so its loss is noticed
  kStoreBye = 6,    // the rank finished cleanly
  kStoreLost = 7,   // ranks whose connection dropped without BYE, in order (i64 each)
  kStoreAuth = 8,   // value: the job's secret
};

struct StoreLimits {
  // Largest request or reply after the length prefix. The store carries addresses and ids of a
  // few hundred bytes per rank; 16 MiB leaves room for thousands of ranks.
  static constexpr size_t kMaxMessage = size_t{16} << 20;
  size_t max_message = kMaxMessage;
  size_t max_auth_message = 1024;          // before a connection has presented the secret
  size_t max_output = size_t{32} << 20;    // queued replies at which a connection stops being read
  size_t max_lost = 65536;                 // lost ranks remembered (the first ones matter)
};

// Bytes of one request, as TcpStore sends it.
std::string encode_store_request(uint8_t op, std::string_view key, std::string_view value);
std::string store_i64_bytes(int64_t v);
// The first 8 bytes as an i64 (fewer: zero-padded).
int64_t store_bytes_i64(std::string_view s);

// Same length and bytes, in time that does not depend on where they first differ.
bool secrets_equal(std::string_view a, std::string_view b);

class StoreState {
 public:
  explicit StoreState(std::string secret, StoreLimits limits = {});

  enum class Step { kIdle, kProgress, kClose };

  void open(int id);
  // Appends bytes received on `id` and handles what can be handled. kClose: the connection broke
  // the protocol or gave a wrong secret; send what pending_output() holds (a refusal) if
  // possible, then close it.
  Step receive(int id, const char* data, size_t n);
  // Handles the connection's buffered requests that can be handled now (after its output
  // drained or its parked GET was answered by another connection's SET).
  Step process(int id);
  // The connection dropped: a rank that registered and did not say goodbye is lost.
  void close(int id);

  std::string_view pending_output(int id) const;
  void consume_output(int id, size_t n);
  // Whether to read more from it: not while a whole request waits (its output is full, or it
  // is parked) — so a client that never reads its replies only fills its own socket buffers.
  bool wants_input(int id) const;
  bool authenticated(int id) const;
  // Part of a request has arrived and the rest has not.
  bool mid_request(int id) const;
  // Memory held for the connection (input and output buffers).
  size_t buffered_bytes(int id) const;
  const std::vector<int>& lost() const { return lost_; }

 private:
  struct Conn {
    std::string in;
    size_t in_off = 0;  // consumed prefix of `in`
    std::string out;
    size_t out_off = 0;  // sent prefix of `out`
    bool authed = false;
    int rank = -1;
    bool bye = false;
    bool parked = false;
    std::string parked_key;
  };
  enum class Next { kNone, kPartial, kWhole, kBad };
  Next next_request(const Conn& c) const;
  Step handle(int id, Conn& c, uint8_t op, std::string_view key, std::string_view value);
  void reply(Conn& c, std::string_view payload);
  void wake_waiters(const std::string& key);
  Conn& conn(int id);
  const Conn& conn(int id) const;

  std::string secret_;
  StoreLimits limits_;
  std::map<int, Conn> conns_;
  std::map<std::string, std::string> kv_;
  std::map<std::string, std::set<int>> parked_;  // key -> connections waiting in GET
  std::vector<int> lost_;  // in the order the connections dropped: the first is the cause
};

}  // namespace mt::comm
