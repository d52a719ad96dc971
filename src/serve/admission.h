#pragma once
// How many requests `megatron serve` holds at once (--max-concurrent-requests): running, or
// queued for the model. Beyond that, and while draining for shutdown, a request is refused with
// 503 at once rather than queued without bound. Shutdown waits, bounded, for the held ones.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

namespace mt::serve {

class Admission {
 public:
  explicit Admission(int64_t max) : max_(max) {}
  // A ticket, held until it is destroyed; throws RequestError(503) when full or draining.
  std::shared_ptr<void> enter();
  void drain();  // refuse every request from now on
  bool draining() const;
  // Until no ticket is held or `timeout` passes; true when none is.
  bool wait_idle(std::chrono::duration<double> timeout);
  int64_t held() const;

 private:
  void leave();

  const int64_t max_;
  mutable std::mutex mu_;
  std::condition_variable idle_;
  int64_t held_ = 0;
  bool draining_ = false;
};

}  // namespace mt::serve
