#include "comm/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "comm/communicator.h"

namespace mt::comm {

namespace {
int ms_until(Clock::time_point deadline) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return ms < 0 ? 0 : static_cast<int>(std::min<int64_t>(ms, 1 << 30));
}

addrinfo* resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_INET;  // IPv4 keeps MASTER_ADDR handling simple and predictable
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  std::string p = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), p.c_str(), &hints, &res);
  if (rc != 0) throw CommError(fmt::format("cannot resolve '{}': {} (check MASTER_ADDR)", host, gai_strerror(rc)));
  return res;
}
}  // namespace

Socket::~Socket() { close(); }

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void Socket::send_all(const void* p, size_t n, Clock::time_point deadline, const char* what) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    pollfd pfd{fd_, POLLOUT, 0};
    int rc = ::poll(&pfd, 1, ms_until(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) throw CommError(fmt::format("{}: timed out sending", what));
    ssize_t k = ::send(fd_, c, n, MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw CommError(fmt::format("{}: connection lost ({})", what, std::strerror(errno)));
    }
    c += k;
    n -= static_cast<size_t>(k);
  }
}

void Socket::recv_all(void* p, size_t n, Clock::time_point deadline, const char* what) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    pollfd pfd{fd_, POLLIN, 0};
    int rc = ::poll(&pfd, 1, ms_until(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) throw CommError(fmt::format("{}: timed out", what));
    ssize_t k = ::recv(fd_, c, n, 0);
    if (k == 0) throw CommError(fmt::format("{}: connection closed by the other side", what));
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw CommError(fmt::format("{}: connection lost ({})", what, std::strerror(errno)));
    }
    c += k;
    n -= static_cast<size_t>(k);
  }
}

Socket connect_with_retry(const std::string& host, int port, Clock::time_point deadline) {
  std::string last = "no attempt";
  auto delay = std::chrono::milliseconds(10);
  while (true) {
    addrinfo* res = resolve(host, port, false);
    for (addrinfo* a = res; a; a = a->ai_next) {
      int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        freeaddrinfo(res);
        return Socket(fd);
      }
      last = std::strerror(errno);
      ::close(fd);
    }
    freeaddrinfo(res);
    if (Clock::now() + delay >= deadline)
      throw CommError(fmt::format("could not connect to the rendezvous store at {}:{} ({}) before the timeout; "
                                  "is rank 0 (or 'megatron launch') running, and are MASTER_ADDR/MASTER_PORT right?",
                                  host, port, last));
    std::this_thread::sleep_for(delay);
    delay = std::min(delay * 2, std::chrono::milliseconds(500));
  }
}

int listen_on(const std::string& host, int port, int* bound_port) {
  addrinfo* res = resolve(host == "0.0.0.0" ? "" : host, port, true);
  std::string err = "no address";
  for (addrinfo* a = res; a; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) {
      sockaddr_in sa{};
      socklen_t len = sizeof(sa);
      getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
      if (bound_port) *bound_port = ntohs(sa.sin_port);
      freeaddrinfo(res);
      return fd;
    }
    err = std::strerror(errno);
    ::close(fd);
  }
  freeaddrinfo(res);
  throw CommError(fmt::format("cannot listen on {}:{} ({}); the address must be one of this machine's "
                              "(--master-addr / MASTER_ADDR) and the port free (--master-port / MASTER_PORT)",
                              host.empty() ? "*" : host, port, err));
}

bool is_loopback_address(const std::string& host) {
  addrinfo* res = resolve(host, 0, false);
  bool all = res != nullptr;
  for (addrinfo* a = res; a; a = a->ai_next) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
    all = all && (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  freeaddrinfo(res);
  return all;
}

std::string local_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || !res) return "127.0.0.1";
  std::string out = "127.0.0.1";
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  // A UDP connect sends nothing; it only asks the kernel which route (and source address) it would use.
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in sa{};
    socklen_t len = sizeof(sa);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0) {
      char buf[INET_ADDRSTRLEN];
      if (inet_ntop(AF_INET, &sa.sin_addr, buf, sizeof(buf))) out = buf;
    }
  }
  if (fd >= 0) ::close(fd);
  freeaddrinfo(res);
  return out;
}

}  // namespace mt::comm
