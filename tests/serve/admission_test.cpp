// Admission: at most --max-concurrent-requests tickets, 503 beyond and while draining, and a
// bounded wait for the held ones at shutdown.
#include "serve/admission.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "serve/request.h"

namespace mt::serve {
namespace {

int refusal_status(Admission& a, std::string* msg) {
  try {
    a.enter();
  } catch (const RequestError& e) {
    *msg = e.what();
    return e.status;
  }
  return 0;
}

TEST(ServeAdmission, FullThenFreedThenDraining) {
  Admission a(2);
  auto t1 = a.enter();
  auto t2 = a.enter();
  EXPECT_EQ(a.held(), 2);
  std::string msg;
  EXPECT_EQ(refusal_status(a, &msg), 503);
  EXPECT_NE(msg.find("--max-concurrent-requests"), std::string::npos) << msg;
  t1.reset();
  auto t3 = a.enter();  // a freed place is taken again
  EXPECT_EQ(a.held(), 2);
  a.drain();
  t2.reset();
  EXPECT_EQ(refusal_status(a, &msg), 503);
  EXPECT_NE(msg.find("shutting down"), std::string::npos) << msg;
  EXPECT_FALSE(a.wait_idle(std::chrono::milliseconds(10)));  // t3 still held
  std::thread release([&] { t3.reset(); });
  EXPECT_TRUE(a.wait_idle(std::chrono::seconds(60)));
  release.join();
  EXPECT_EQ(a.held(), 0);
}

}  // namespace
}  // namespace mt::serve
