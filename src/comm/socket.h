#pragma once
// Minimal blocking TCP helpers with deadlines, for the rendezvous store and the launcher.
// Every wait has a deadline so that nothing here can hang forever.
#include <chrono>
#include <cstdint>
#include <string>

namespace mt::comm {

using Clock = std::chrono::steady_clock;

// A connected socket; closes on destruction.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket();
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void close();
  // Throw mt::comm::CommError (with `what` in the message) on failure or when the deadline passes.
  void send_all(const void* p, size_t n, Clock::time_point deadline, const char* what);
  void recv_all(void* p, size_t n, Clock::time_point deadline, const char* what);

 private:
  int fd_ = -1;
};

// Connects to host:port, retrying until the deadline (the server may not be up yet).
Socket connect_with_retry(const std::string& host, int port, Clock::time_point deadline);

// Listens on host:port (host "" or "0.0.0.0" = all interfaces; port 0 = any). Returns the fd.
int listen_on(const std::string& host, int port, int* bound_port);

// Whether every IPv4 address `host` resolves to is a loopback one (127.0.0.0/8).
bool is_loopback_address(const std::string& host);

// The local address a connection to `host` would leave from: the interface peers can reach
// this process on (127.0.0.1 for a local master).
std::string local_address_towards(const std::string& host);

}  // namespace mt::comm
