#pragma once
// A key-value store for rendezvous: Gloo's full-mesh connection setup, NCCL unique-id exchange,
// and finding out which rank is gone when a collective fails. TcpStore talks to a
// TcpStoreServer hosted by `megatron launch` or by world rank 0 at MASTER_ADDR:MASTER_PORT.
// Every call waits at most the store's timeout, never forever. Every connection presents the
// job's secret (MT_STORE_SECRET) first; see store_protocol.h for the wire format and limits.
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/socket.h"
#include "comm/store_protocol.h"

namespace mt::comm {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Waits until the key exists (up to the timeout) and returns its value.
  virtual std::string get(const std::string& key) = 0;
  // Atomically adds to an integer counter (created at 0) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  virtual bool check(const std::string& key) = 0;
  // Ranks whose store connection dropped without a clean goodbye (processes that died), in
  // the order they dropped: the first is usually the cause, the rest stopped because of it.
  virtual std::vector<int> lost_ranks() = 0;
  virtual std::chrono::milliseconds timeout() const = 0;
  // Where the store lives, for error messages.
  virtual std::string where() const = 0;
};

// All `size` callers return once all have arrived (or the timeout passes, with an error).
void store_barrier(Store& store, const std::string& name, int size);

// The environment variable that carries the job's store secret to its ranks.
inline constexpr const char* kStoreSecretEnv = "MT_STORE_SECRET";
// 32 random bytes from the kernel, as 64 hex digits.
std::string random_store_secret();

struct StoreServerOptions {
  StoreLimits limits;
  // A connection that has not presented the secret by then is closed.
  std::chrono::milliseconds auth_timeout{30000};
  // A connection that leaves a request half-sent, or replies unread, this long is closed. Ranks
  // never do either: each waits for its reply before sending the next request.
  std::chrono::milliseconds stall_timeout{120000};
  // Connections not yet authenticated; more wait in the listen backlog.
  size_t max_unauthenticated = 64;
};

class TcpStoreServer {
 public:
  // Listens on host:port (port 0 = any free port, see port()) and serves clients that present
  // `secret`, from one background thread with non-blocking sockets: a client that stops
  // reading or sending stalls only itself.
  TcpStoreServer(const std::string& host, int port, std::string secret, StoreServerOptions options = {});
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  int port() const { return port_; }

 private:
  void serve();
  int listen_fd_ = -1;
  int port_ = 0;
  int wake_[2] = {-1, -1};
  std::string secret_;
  StoreServerOptions options_;
  std::thread thread_;
};

class TcpStore final : public Store {
 public:
  // Connects (retrying until the timeout) and presents `secret`; `rank` >= 0 registers this
  // connection as that rank so that its loss can be reported.
  TcpStore(const std::string& host, int port, std::chrono::milliseconds timeout, std::string secret, int rank = -1);
  // Tells the server this rank finished cleanly. A connection that closes without it (a crash,
  // an error exit) marks the rank as lost.
  void goodbye();
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::string& key) override;
  std::vector<int> lost_ranks() override;
  std::chrono::milliseconds timeout() const override { return timeout_; }
  std::string where() const override { return host_ + ":" + std::to_string(port_); }

 private:
  // A new connection that has presented the secret.
  Socket open(Clock::time_point deadline, const char* what);
  std::string request(uint8_t op, const std::string& key, const std::string& value, const char* what);
  std::string host_;
  int port_;
  std::chrono::milliseconds timeout_;
  std::string secret_;
  std::mutex mu_;
  Socket sock_;
};

// Keys prefixed with "name/": one store shared by several rendezvous (groups).
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base) : prefix_(std::move(prefix) + "/"), base_(std::move(base)) {}
  void set(const std::string& k, const std::string& v) override { base_->set(prefix_ + k, v); }
  std::string get(const std::string& k) override { return base_->get(prefix_ + k); }
  int64_t add(const std::string& k, int64_t d) override { return base_->add(prefix_ + k, d); }
  bool check(const std::string& k) override { return base_->check(prefix_ + k); }
  std::vector<int> lost_ranks() override { return base_->lost_ranks(); }
  std::chrono::milliseconds timeout() const override { return base_->timeout(); }
  std::string where() const override { return base_->where(); }

 private:
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace mt::comm
