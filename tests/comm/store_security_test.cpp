// The rendezvous store facing broken or hostile peers over real sockets: a client without the
// secret, forged lengths in either direction, clients that stop reading or sending, and a crowd
// of connections that never authenticate.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/store.h"
#include "comm/store_peers.h"

namespace mt::comm {
namespace {

using namespace std::chrono_literals;
using testing::authenticate;
using testing::closed_within;
using testing::hung_up_within;
using testing::read_one_reply;
using testing::send_bytes;
Socket raw_connect(int port) { return testing::raw_store_connect(port); }
const std::string kSecret = "0123456789abcdef-security";

void expect_store_works(int port) {
  TcpStore a("127.0.0.1", port, 10s, kSecret, 0);
  TcpStore b("127.0.0.1", port, 10s, kSecret, 1);
  a.set("alive", "yes");
  EXPECT_EQ(b.get("alive"), "yes");
  EXPECT_EQ(a.add("count", 2) + b.add("count", 3), 7);
  a.goodbye();
  b.goodbye();
}

TEST(StoreSecurity, ClientWithoutTheSecretIsRefused) {
  TcpStoreServer server("127.0.0.1", 0, kSecret);
  try {
    TcpStore wrong("127.0.0.1", server.port(), 5s, "another-jobs-secret-0000", 0);
    FAIL() << "a wrong secret was accepted";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("refused this process's MT_STORE_SECRET"), std::string::npos) << e.what();
  }
  // No secret at all: the first request is a SET, which is not served; the connection is closed.
  Socket intruder = raw_connect(server.port());
  send_bytes(intruder, encode_store_request(kStoreSet, "k", "planted"));
  EXPECT_TRUE(closed_within(intruder, 10s));
  TcpStore good("127.0.0.1", server.port(), 5s, kSecret, 0);
  EXPECT_FALSE(good.check("k"));
}

TEST(StoreSecurity, HugeLengthPrefixClosesTheConnectionAtOnce) {
  TcpStoreServer server("127.0.0.1", 0, kSecret);
  for (bool authed : {false, true}) {
    Socket s = raw_connect(server.port());
    if (authed) {
      ASSERT_TRUE(authenticate(s, kSecret));
    }
    // The old server waited for (and buffered) the 4 GiB this announces.
    send_bytes(s, std::string(4, '\xff'));
    EXPECT_TRUE(closed_within(s, 10s)) << "authenticated: " << authed;
  }
  expect_store_works(server.port());
}

TEST(StoreSecurity, ForgedReplyLengthIsRefusedByTheClient) {
  int port = 0;
  Socket listener(listen_on("127.0.0.1", 0, &port));
  std::atomic<bool> done{false};
  std::thread fake([&] {
    Socket c(::accept(listener.fd(), nullptr, nullptr));
    char buf[256];
    if (::recv(c.fd(), buf, sizeof(buf), 0) <= 0) return;  // the client's AUTH
    const std::string forged = "\xf0\xff\xff\xff";      // a 4 GiB reply
    if (::send(c.fd(), forged.data(), forged.size(), MSG_NOSIGNAL) < 0) return;
    while (!done) std::this_thread::sleep_for(10ms);    // keep it open: only the length may fail it
  });
  const auto t0 = Clock::now();
  try {
    TcpStore victim("127.0.0.1", port, 20s, kSecret, 0);
    FAIL() << "a forged reply was accepted";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("over the protocol's"), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - t0, 10s);  // refused from the length, not after the 20 s timeout
  done = true;
  fake.join();
}

TEST(StoreSecurity, ClientThatStopsReadingDoesNotBlockTheOthers) {
  StoreServerOptions options;
  options.stall_timeout = 3s;
  TcpStoreServer server("127.0.0.1", 0, kSecret, options);
  // The staller sets an 8 MB value, then pipelines GETs of it without reading any reply.
  Socket staller = raw_connect(server.port());
  ASSERT_TRUE(authenticate(staller, kSecret));
  ASSERT_TRUE(testing::stall_store(staller)) << "the server kept reading a client that never reads";
  // Every other client is served, each request well inside its 10 s timeout.
  expect_store_works(server.port());
  // And the staller itself is cut off after the stall timeout.
  EXPECT_TRUE(hung_up_within(staller, 60s));
}

TEST(StoreSecurity, SilentAndHalfSentConnectionsAreClosed) {
  StoreServerOptions options;
  options.auth_timeout = 500ms;
  options.stall_timeout = 1s;
  TcpStoreServer server("127.0.0.1", 0, kSecret, options);
  Socket silent = raw_connect(server.port());
  Socket half = raw_connect(server.port());
  ASSERT_TRUE(authenticate(half, kSecret));
  send_bytes(half, encode_store_request(kStoreSet, "k", "value").substr(0, 7));
  EXPECT_TRUE(closed_within(silent, 20s));
  EXPECT_TRUE(closed_within(half, 20s));
}

TEST(StoreSecurity, ConnectionsThatNeverAuthenticateDoNotLockOutTheRanks) {
  StoreServerOptions options;
  options.auth_timeout = 1s;
  TcpStoreServer server("127.0.0.1", 0, kSecret, options);
  // More than max_unauthenticated: the extra ones wait in the backlog, and so does the rank
  // below until the silent ones time out.
  std::vector<Socket> crowd;
  for (size_t i = 0; i < 3 * options.max_unauthenticated; ++i) crowd.push_back(raw_connect(server.port()));
  expect_store_works(server.port());
}

}  // namespace
}  // namespace mt::comm
