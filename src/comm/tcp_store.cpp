// TcpStore wire format (little-endian, one request in flight per connection):
//   request  = u32 length | u8 op | u32 key length | key | value (the rest)
//   response = u32 length | payload
// A GET for a missing key is parked on the server and answered when the key is set, so
// clients wait without polling; the client bounds the wait with its own deadline.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "comm/communicator.h"
#include "comm/store.h"

namespace mt::comm {

namespace {

enum Op : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kCheck = 4, kHello = 5, kBye = 6, kLost = 7 };

std::string i64_bytes(int64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }
int64_t bytes_i64(const std::string& s) {
  int64_t v = 0;
  std::memcpy(&v, s.data(), std::min<size_t>(8, s.size()));
  return v;
}

struct Client {
  int fd = -1;
  std::string in;
  int rank = -1;
  bool bye = false;
};

// Best effort: a reply to a client that has gone is simply dropped (its loss is noticed on read).
void reply(int fd, const std::string& payload) {
  uint32_t len = static_cast<uint32_t>(payload.size());
  std::string msg(reinterpret_cast<const char*>(&len), 4);
  msg += payload;
  size_t off = 0;
  while (off < msg.size()) {
    ssize_t k = ::send(fd, msg.data() + off, msg.size() - off, MSG_NOSIGNAL);
    if (k <= 0) {
      if (k < 0 && errno == EINTR) continue;
      return;
    }
    off += static_cast<size_t>(k);
  }
}

}  // namespace

void store_barrier(Store& store, const std::string& name, int size) {
  if (store.add(name + "/arrived", 1) == size) store.set(name + "/go", "1");
  store.get(name + "/go");
}

TcpStoreServer::TcpStoreServer(const std::string& host, int port) {
  listen_fd_ = listen_on(host, port, &port_);
  if (::pipe(wake_) != 0) throw CommError("cannot create the store's wake-up pipe");
  thread_ = std::thread([this] { serve(); });
}

TcpStoreServer::~TcpStoreServer() {
  char c = 1;
  if (::write(wake_[1], &c, 1) < 0) {
  }
  if (thread_.joinable()) thread_.join();
  ::close(listen_fd_);
  ::close(wake_[0]);
  ::close(wake_[1]);
}

void TcpStoreServer::serve() {
  std::map<std::string, std::string> kv;
  std::map<int, Client> clients;                       // by fd
  std::multimap<std::string, int> parked;              // key -> fd waiting in GET
  std::vector<int> lost;  // in the order the connections dropped: the first is the cause
  auto wake_waiters = [&](const std::string& key) {
    auto [b, e] = parked.equal_range(key);
    for (auto it = b; it != e; ++it) reply(it->second, kv[key]);
    parked.erase(b, e);
  };
  auto handle = [&](Client& c, uint8_t op, const std::string& key, const std::string& val) {
    switch (op) {
      case kSet:
        kv[key] = val;
        reply(c.fd, "");
        wake_waiters(key);
        break;
      case kGet:
        if (kv.count(key)) reply(c.fd, kv[key]);
        else parked.emplace(key, c.fd);
        break;
      case kAdd: {
        int64_t v = (kv.count(key) ? bytes_i64(kv[key]) : 0) + bytes_i64(val);
        kv[key] = i64_bytes(v);
        reply(c.fd, kv[key]);
        wake_waiters(key);
        break;
      }
      case kCheck: reply(c.fd, kv.count(key) ? "1" : "0"); break;
      case kHello: c.rank = static_cast<int>(bytes_i64(val)); reply(c.fd, ""); break;
      case kBye: c.bye = true; reply(c.fd, ""); break;
      case kLost: {
        std::string out;
        for (int r : lost) out += i64_bytes(r);
        reply(c.fd, out);
        break;
      }
      default: break;
    }
  };
  while (true) {
    std::vector<pollfd> fds;
    fds.push_back({wake_[0], POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    for (auto& [fd, c] : clients) fds.push_back({fd, POLLIN, 0});
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[0].revents) return;
    if (fds[1].revents & POLLIN) {
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) clients[fd].fd = fd;
    }
    for (size_t i = 2; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      Client& c = clients[fds[i].fd];
      char buf[65536];
      ssize_t k = ::recv(c.fd, buf, sizeof(buf), 0);
      if (k <= 0) {
        if (k < 0 && errno == EINTR) continue;
        if (c.rank >= 0 && !c.bye) lost.push_back(c.rank);
        for (auto it = parked.begin(); it != parked.end();) it = it->second == c.fd ? parked.erase(it) : std::next(it);
        ::close(c.fd);
        clients.erase(fds[i].fd);
        continue;
      }
      c.in.append(buf, static_cast<size_t>(k));
      while (c.in.size() >= 4) {
        uint32_t len;
        std::memcpy(&len, c.in.data(), 4);
        if (c.in.size() < 4 + static_cast<size_t>(len)) break;
        std::string msg = c.in.substr(4, len);
        c.in.erase(0, 4 + static_cast<size_t>(len));
        if (msg.size() < 5) continue;
        uint32_t klen;
        std::memcpy(&klen, msg.data() + 1, 4);
        if (5 + static_cast<size_t>(klen) > msg.size()) continue;
        handle(c, static_cast<uint8_t>(msg[0]), msg.substr(5, klen), msg.substr(5 + klen));
      }
    }
  }
}

TcpStore::TcpStore(const std::string& host, int port, std::chrono::milliseconds timeout, int rank)
    : host_(host), port_(port), timeout_(timeout) {
  sock_ = connect_with_retry(host, port, Clock::now() + timeout);
  if (rank >= 0) request(kHello, "", i64_bytes(rank), "registering with the rendezvous store");
}

void TcpStore::goodbye() {
  try {
    request(kBye, "", "", "leaving the rendezvous store");
  } catch (const std::exception&) {
    // The store is already gone (its host exited first): nothing to say goodbye to.
  }
}

std::string TcpStore::request(uint8_t op, const std::string& key, const std::string& value, const char* what) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto deadline = Clock::now() + timeout_;
  const std::string ctx = fmt::format("rendezvous store at {} ({})", where(), what);
  uint32_t klen = static_cast<uint32_t>(key.size());
  uint32_t len = static_cast<uint32_t>(1 + 4 + key.size() + value.size());
  std::string msg(reinterpret_cast<const char*>(&len), 4);
  msg.push_back(static_cast<char>(op));
  msg.append(reinterpret_cast<const char*>(&klen), 4);
  msg += key;
  msg += value;
  if (!sock_.valid()) throw CommError(ctx + ": the connection was lost earlier");
  try {
    sock_.send_all(msg.data(), msg.size(), deadline, ctx.c_str());
    uint32_t rlen = 0;
    sock_.recv_all(&rlen, 4, deadline, ctx.c_str());
    std::string out(rlen, '\0');
    sock_.recv_all(out.data(), rlen, deadline, ctx.c_str());
    return out;
  } catch (const CommError&) {
    sock_.close();  // a half-read reply would desynchronise the stream
    throw;
  }
}

void TcpStore::set(const std::string& key, const std::string& value) { request(kSet, key, value, "set"); }

std::string TcpStore::get(const std::string& key) {
  return request(kGet, key, "", fmt::format("waiting for key '{}'", key).c_str());
}

int64_t TcpStore::add(const std::string& key, int64_t delta) { return bytes_i64(request(kAdd, key, i64_bytes(delta), "add")); }

bool TcpStore::check(const std::string& key) { return request(kCheck, key, "", "check") == "1"; }

std::vector<int> TcpStore::lost_ranks() {
  // A fresh short-lived connection: the main one may be busy in a long GET on another thread,
  // and this question is asked while diagnosing a failure, when waiting is the wrong thing.
  const auto deadline = Clock::now() + std::min<std::chrono::milliseconds>(timeout_, std::chrono::seconds(5));
  Socket s = connect_with_retry(host_, port_, deadline);
  const char* what = "asking the rendezvous store for lost ranks";
  std::string msg(4, '\0');
  uint32_t len = 5, klen = 0;
  std::memcpy(msg.data(), &len, 4);
  msg.push_back(static_cast<char>(kLost));
  msg.append(reinterpret_cast<const char*>(&klen), 4);
  s.send_all(msg.data(), msg.size(), deadline, what);
  uint32_t rlen = 0;
  s.recv_all(&rlen, 4, deadline, what);
  std::string r(rlen, '\0');
  s.recv_all(r.data(), rlen, deadline, what);
  std::vector<int> out;
  for (size_t i = 0; i + 8 <= r.size(); i += 8) out.push_back(static_cast<int>(bytes_i64(r.substr(i, 8))));
  return out;
}

}  // namespace mt::comm
