// TcpStoreServer: one thread, non-blocking sockets and poll(). The protocol (limits, secret,
// parked GETs) lives in StoreState; this file moves bytes between it and the sockets and closes
// connections that stall. No call here blocks, so one slow or hostile client delays no other.
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>

#include "comm/communicator.h"
#include "comm/store.h"

namespace mt::comm {

namespace {

using Step = StoreState::Step;

struct Peer {
  Clock::time_point opened;
  Clock::time_point input_idle_since;   // last time it had no half-sent request, or sent bytes
  Clock::time_point output_idle_since;  // last time it had no unread reply, or read some
};

// Sends what is pending, as far as the socket takes it now. False: the connection is broken.
bool flush(StoreState& st, int fd, Peer& peer) {
  while (true) {
    const std::string_view out = st.pending_output(fd);
    if (out.empty()) return true;
    const ssize_t k = ::send(fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      st.consume_output(fd, static_cast<size_t>(k));
      peer.output_idle_since = Clock::now();
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    return k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
}

int poll_ms(Clock::time_point now, Clock::time_point deadline) {
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 1000));
}

}  // namespace

TcpStoreServer::TcpStoreServer(const std::string& host, int port, std::string secret, StoreServerOptions options)
    : secret_(std::move(secret)), options_(options) {
  MT_CHECK(!secret_.empty(), "the rendezvous store needs a secret");
  listen_fd_ = listen_on(host, port, &port_);
  if (::fcntl(listen_fd_, F_SETFL, ::fcntl(listen_fd_, F_GETFL) | O_NONBLOCK) != 0 || ::pipe2(wake_, O_CLOEXEC) != 0) {
    ::close(listen_fd_);
    throw CommError("cannot set up the rendezvous store's sockets");
  }
  thread_ = std::thread([this] {
    try {
      serve();
    } catch (const std::exception& e) {
      // Only a bug or memory exhaustion gets here. Closing every connection (serve's cleanup)
      // makes each rank fail with an error that names the store, instead of aborting the host.
      std::fprintf(stderr, "megatron: the rendezvous store stopped: %s\n", e.what());
    }
  });
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
  StoreState st(secret_, options_.limits);
  std::map<int, Peer> peers;  // by fd
  struct CloseAll {
    std::map<int, Peer>& peers;
    ~CloseAll() {
      for (auto& entry : peers) ::close(entry.first);
    }
  } close_all{peers};
  auto drop = [&](int fd) {
    st.close(fd);
    ::close(fd);
    peers.erase(fd);
  };
  // A connection that broke the protocol or gave a wrong secret: send the refusal if the socket
  // takes it now, then close.
  auto refuse = [&](int fd) {
    flush(st, fd, peers[fd]);
    drop(fd);
  };
  Clock::time_point accept_paused_until{};
  std::vector<pollfd> fds;
  std::vector<int> doomed;
  while (true) {
    // Everything that can be handled now: a SET may answer another connection's parked GET and
    // let the requests queued behind it run.
    for (bool progress = true; progress;) {
      progress = false;
      doomed.clear();
      for (auto& entry : peers) {
        const Step step = st.process(entry.first);
        if (step == Step::kClose) doomed.push_back(entry.first);
        progress |= step == Step::kProgress;
      }
      for (int fd : doomed) refuse(fd);
    }

    const auto now = Clock::now();
    auto next_wake = now + std::chrono::seconds(1);
    doomed.clear();
    for (auto& [fd, peer] : peers) {
      if (st.pending_output(fd).empty()) peer.output_idle_since = now;
      if (!st.mid_request(fd)) peer.input_idle_since = now;
      auto deadline = std::min(peer.input_idle_since, peer.output_idle_since) + options_.stall_timeout;
      if (!st.authenticated(fd)) deadline = std::min(deadline, peer.opened + options_.auth_timeout);
      if (deadline <= now) doomed.push_back(fd);
      else next_wake = std::min(next_wake, deadline);
    }
    for (int fd : doomed) drop(fd);
    size_t unauthenticated = 0;
    for (auto& entry : peers) unauthenticated += st.authenticated(entry.first) ? 0 : 1;

    fds.clear();
    fds.push_back({wake_[0], POLLIN, 0});
    const bool accepting = unauthenticated < options_.max_unauthenticated && now >= accept_paused_until;
    fds.push_back({listen_fd_, static_cast<short>(accepting ? POLLIN : 0), 0});
    if (now < accept_paused_until) next_wake = std::min(next_wake, accept_paused_until);
    for (auto& entry : peers) {
      const int fd = entry.first;
      short events = 0;
      if (st.wants_input(fd)) events |= POLLIN;
      if (!st.pending_output(fd).empty()) events |= POLLOUT;
      fds.push_back({fd, events, 0});
    }
    if (::poll(fds.data(), fds.size(), poll_ms(now, next_wake)) < 0) {
      if (errno == EINTR) continue;
      throw CommError(fmt::format("poll failed ({})", std::strerror(errno)));
    }
    if (fds[0].revents) return;
    if (fds[1].revents & POLLIN) {
      while (unauthenticated < options_.max_unauthenticated) {
        const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
          // Out of descriptors or memory: leave the rest in the backlog for a moment rather
          // than spinning on a listen socket that stays readable.
          if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
            accept_paused_until = Clock::now() + std::chrono::milliseconds(100);
          break;
        }
        int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        st.open(fd);
        const auto t = Clock::now();
        peers[fd] = Peer{t, t, t};
        ++unauthenticated;
      }
    }
    for (size_t i = 2; i < fds.size(); ++i) {
      const int fd = fds[i].fd;
      const short re = fds[i].revents;
      if (!re) continue;
      Peer& peer = peers[fd];
      if ((re & POLLOUT) && !flush(st, fd, peer)) {
        drop(fd);
        continue;
      }
      if (re & POLLIN) {
        char buf[65536];
        const ssize_t k = ::recv(fd, buf, sizeof(buf), 0);
        if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        if (k <= 0) {  // closed, or reset: a rank that did not say goodbye is now lost
          drop(fd);
          continue;
        }
        peer.input_idle_since = Clock::now();
        if (st.receive(fd, buf, static_cast<size_t>(k)) == Step::kClose) {
          refuse(fd);
          continue;
        }
        if (!flush(st, fd, peer)) drop(fd);  // answer at once rather than after another poll
      } else if (re & (POLLERR | POLLHUP | POLLNVAL)) {
        drop(fd);
      }
    }
  }
}

}  // namespace mt::comm
