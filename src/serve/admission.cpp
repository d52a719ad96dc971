#include "serve/admission.h"

#include <fmt/format.h>

#include "serve/request.h"

namespace mt::serve {

std::shared_ptr<void> Admission::enter() {
  std::lock_guard<std::mutex> lock(mu_);
  if (draining_) throw RequestError(503, "the server is shutting down");
  if (held_ >= max_)
    throw RequestError(503, fmt::format("the server is busy ({} requests in flight, its --max-concurrent-requests); "
                                        "retry later",
                                        max_));
  ++held_;
  // The ticket's deleter gives the place back; the pointer itself is never read.
  return std::shared_ptr<void>(this, [](void* self) { static_cast<Admission*>(self)->leave(); });
}

void Admission::leave() {
  std::lock_guard<std::mutex> lock(mu_);
  if (--held_ == 0) idle_.notify_all();
}

void Admission::drain() {
  std::lock_guard<std::mutex> lock(mu_);
  draining_ = true;
}

bool Admission::draining() const {
  std::lock_guard<std::mutex> lock(mu_);
  return draining_;
}

bool Admission::wait_idle(std::chrono::duration<double> timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_.wait_for(lock, timeout, [&] { return held_ == 0; });
}

int64_t Admission::held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_;
}

}  // namespace mt::serve
