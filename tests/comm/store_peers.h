#pragma once
// Raw rendezvous-store clients for tests: they speak the wire protocol by hand, so they can do
// what TcpStore never does (skip the secret, send a half request, never read a reply).
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>

#include "comm/socket.h"
#include "comm/store_protocol.h"

namespace mt::testing {

inline comm::Socket raw_store_connect(int port, std::chrono::seconds wait = std::chrono::seconds(5)) {
  return comm::connect_with_retry("127.0.0.1", port, comm::Clock::now() + wait);
}

inline void send_bytes(comm::Socket& s, const std::string& bytes) {
  s.send_all(bytes.data(), bytes.size(), comm::Clock::now() + std::chrono::seconds(30), "test client");
}

inline std::string read_one_reply(comm::Socket& s) {
  uint32_t n = 0;
  s.recv_all(&n, 4, comm::Clock::now() + std::chrono::seconds(30), "test client");
  std::string r(n, '\0');
  s.recv_all(r.data(), n, comm::Clock::now() + std::chrono::seconds(30), "test client");
  return r;
}

inline bool authenticate(comm::Socket& s, const std::string& secret) {
  send_bytes(s, comm::encode_store_request(comm::kStoreAuth, "", secret));
  return read_one_reply(s) == "1";
}

// Sets an 8 MB value, then pipelines GETs of it without reading a reply until neither this
// socket nor the server's takes more for a second. Returns whether it got there (the server
// stopped reading it) within a minute.
inline bool stall_store(comm::Socket& s) {
  send_bytes(s, comm::encode_store_request(comm::kStoreSet, "stall/big", std::string(8 << 20, 'x')));
  if (read_one_reply(s) != "") return false;
  std::string gets;
  for (int i = 0; i < 4096; ++i) gets += comm::encode_store_request(comm::kStoreGet, "stall/big", "");
  size_t off = 0;
  for (auto until = comm::Clock::now() + std::chrono::seconds(60); comm::Clock::now() < until;) {
    const ssize_t k = ::send(s.fd(), gets.data() + off, gets.size() - off, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (k > 0) {
      off = (off + static_cast<size_t>(k)) % gets.size();  // wraps only at a request boundary
      continue;
    }
    if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return false;
    pollfd p{s.fd(), POLLOUT, 0};
    if (::poll(&p, 1, 1000) == 0) return true;
  }
  return false;
}

// Whether the server closes the connection within `limit`, reading (and dropping) what it sends.
inline bool closed_within(comm::Socket& s, std::chrono::milliseconds limit) {
  const auto deadline = comm::Clock::now() + limit;
  char buf[4096];
  while (comm::Clock::now() < deadline) {
    pollfd p{s.fd(), POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const ssize_t k = ::recv(s.fd(), buf, sizeof(buf), 0);
    if (k == 0 || (k < 0 && errno != EINTR && errno != EAGAIN)) return true;
  }
  return false;
}

// Like closed_within, without reading: for a client whose not reading is the point.
inline bool hung_up_within(comm::Socket& s, std::chrono::milliseconds limit) {
  const auto deadline = comm::Clock::now() + limit;
  while (comm::Clock::now() < deadline) {
    pollfd p{s.fd(), POLLRDHUP, 0};
    if (::poll(&p, 1, 100) > 0 && (p.revents & (POLLHUP | POLLERR | POLLRDHUP))) return true;
  }
  return false;
}

}  // namespace mt::testing
