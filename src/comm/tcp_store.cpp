// TcpStore, the client side of the rendezvous store (the protocol is in store_protocol.h, the
// server in tcp_store_server.cpp). One request in flight per connection.
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "comm/communicator.h"
#include "comm/store.h"

namespace mt::comm {

namespace {

// Reads one reply. Its length is checked before anything is allocated: a forged reply (or a
// port that is not a store at all) must not make a rank allocate gigabytes.
std::string read_reply(Socket& s, Clock::time_point deadline, const std::string& ctx) {
  uint32_t len = 0;
  s.recv_all(&len, 4, deadline, ctx.c_str());
  if (len > StoreLimits::kMaxMessage)
    throw CommError(fmt::format("{}: a reply of {} bytes, over the protocol's {} byte limit: is MASTER_ADDR:MASTER_PORT "
                                "a megatron rendezvous store?",
                                ctx, len, StoreLimits::kMaxMessage));
  std::string out(len, '\0');
  s.recv_all(out.data(), len, deadline, ctx.c_str());
  return out;
}

}  // namespace

std::string random_store_secret() {
  unsigned char bytes[32];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t k = ::getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) throw CommError(fmt::format("cannot read random bytes for the store secret ({})", std::strerror(errno)));
    got += static_cast<size_t>(k);
  }
  std::string hex;
  for (unsigned char b : bytes) hex += fmt::format("{:02x}", b);
  return hex;
}

void store_barrier(Store& store, const std::string& name, int size) {
  if (store.add(name + "/arrived", 1) == size) store.set(name + "/go", "1");
  store.get(name + "/go");
}

TcpStore::TcpStore(const std::string& host, int port, std::chrono::milliseconds timeout, std::string secret, int rank)
    : host_(host), port_(port), timeout_(timeout), secret_(std::move(secret)) {
  sock_ = open(Clock::now() + timeout, "connecting");
  if (rank >= 0) request(kStoreHello, "", store_i64_bytes(rank), "registering with the rendezvous store");
}

Socket TcpStore::open(Clock::time_point deadline, const char* what) {
  Socket s = connect_with_retry(host_, port_, deadline);
  const std::string ctx = fmt::format("rendezvous store at {} ({})", where(), what);
  const std::string msg = encode_store_request(kStoreAuth, "", secret_);
  s.send_all(msg.data(), msg.size(), deadline, ctx.c_str());
  if (read_reply(s, deadline, ctx) != "1")
    throw CommError(fmt::format("{}: the store refused this process's {}: every process of a job needs the same "
                                "one ('megatron launch' gives its ranks its own; for a job started otherwise, "
                                "export the same value for every rank)",
                                ctx, kStoreSecretEnv));
  return s;
}

void TcpStore::goodbye() {
  try {
    request(kStoreBye, "", "", "leaving the rendezvous store");
  } catch (const std::exception&) {
    // The store is already gone (its host exited first): nothing to say goodbye to.
  }
}

std::string TcpStore::request(uint8_t op, const std::string& key, const std::string& value, const char* what) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto deadline = Clock::now() + timeout_;
  const std::string ctx = fmt::format("rendezvous store at {} ({})", where(), what);
  const std::string msg = encode_store_request(op, key, value);
  if (!sock_.valid()) throw CommError(ctx + ": the connection was lost earlier");
  try {
    sock_.send_all(msg.data(), msg.size(), deadline, ctx.c_str());
    return read_reply(sock_, deadline, ctx);
  } catch (const CommError&) {
    sock_.close();  // a half-read reply would desynchronise the stream
    throw;
  }
}

void TcpStore::set(const std::string& key, const std::string& value) { request(kStoreSet, key, value, "set"); }

std::string TcpStore::get(const std::string& key) {
  return request(kStoreGet, key, "", fmt::format("waiting for key '{}'", key).c_str());
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  return store_bytes_i64(request(kStoreAdd, key, store_i64_bytes(delta), "add"));
}

bool TcpStore::check(const std::string& key) { return request(kStoreCheck, key, "", "check") == "1"; }

std::vector<int> TcpStore::lost_ranks() {
  // A fresh short-lived connection: the main one may be busy in a long GET on another thread,
  // and this question is asked while diagnosing a failure, when waiting is the wrong thing.
  const auto deadline = Clock::now() + std::min<std::chrono::milliseconds>(timeout_, std::chrono::seconds(5));
  const char* what = "asking the rendezvous store for lost ranks";
  Socket s = open(deadline, what);
  const std::string msg = encode_store_request(kStoreLost, "", "");
  s.send_all(msg.data(), msg.size(), deadline, what);
  const std::string r = read_reply(s, deadline, what);
  std::vector<int> out;
  for (size_t i = 0; i + 8 <= r.size(); i += 8) out.push_back(static_cast<int>(store_bytes_i64(r.substr(i, 8))));
  return out;
}

}  // namespace mt::comm
