// The store protocol without sockets (StoreState): authentication first, lengths checked before
// buffering, replies in request order behind a parked GET, and output back-pressure.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "comm/store_protocol.h"

namespace mt::comm {
namespace {

const std::string kSecret = "protocol-test-secret";
using Step = StoreState::Step;

std::string req(uint8_t op, const std::string& key, const std::string& value = "") {
  return encode_store_request(op, key, value);
}

Step feed(StoreState& st, int id, const std::string& bytes) { return st.receive(id, bytes.data(), bytes.size()); }

// Takes every complete reply queued for `id`.
std::vector<std::string> replies(StoreState& st, int id) {
  std::vector<std::string> out;
  std::string_view pending = st.pending_output(id);
  size_t used = 0;
  while (pending.size() - used >= 4) {
    uint32_t n = 0;
    std::memcpy(&n, pending.data() + used, 4);
    if (pending.size() - used - 4 < n) break;
    out.emplace_back(pending.substr(used + 4, n));
    used += 4 + n;
  }
  st.consume_output(id, used);
  return out;
}

StoreState::Step open_authed(StoreState& st, int id) {
  st.open(id);
  Step s = feed(st, id, req(kStoreAuth, "", kSecret));
  EXPECT_EQ(replies(st, id), std::vector<std::string>{"1"});
  return s;
}

TEST(StoreProtocol, NothingIsServedBeforeTheSecret) {
  StoreState st(kSecret);
  st.open(1);
  EXPECT_EQ(feed(st, 1, req(kStoreSet, "k", "v")), Step::kClose);
  st.close(1);
  st.open(2);
  EXPECT_EQ(feed(st, 2, req(kStoreAuth, "", "not-the-secret")), Step::kClose);
  EXPECT_EQ(replies(st, 2), std::vector<std::string>{"0"});
  st.close(2);
  // A prefix of the secret, or the secret with more after it, is not the secret.
  for (const std::string& guess : {kSecret.substr(0, 5), kSecret + "x"}) {
    st.open(3);
    EXPECT_EQ(feed(st, 3, req(kStoreAuth, "", guess)), Step::kClose);
    st.close(3);
  }
  open_authed(st, 4);
  feed(st, 4, req(kStoreCheck, "k"));
  EXPECT_EQ(replies(st, 4), std::vector<std::string>{"0"});  // the refused SET did nothing
}

TEST(StoreProtocol, LengthsAreCheckedBeforeTheBodyArrives) {
  StoreState st(kSecret);
  st.open(1);
  // Before authentication the limit is small: a 2 KiB "secret" is refused from its prefix alone.
  const uint32_t big_auth = 2048;
  EXPECT_EQ(st.receive(1, reinterpret_cast<const char*>(&big_auth), 4), Step::kClose);
  open_authed(st, 2);
  const uint32_t huge = 0xFFFFFFFFu;
  EXPECT_EQ(st.receive(2, reinterpret_cast<const char*>(&huge), 4), Step::kClose);
  EXPECT_LT(st.buffered_bytes(2), size_t{1} << 20);
  // Shorter than op + key length, a key longer than the request, an unknown op, a bad counter.
  for (std::string bad : {std::string("\x03\0\0\0\x02\0\0", 7), std::string("\x05\0\0\0\x02\x09\0\0\0", 9),
                          req(99, "k"), req(kStoreAdd, "n", "1234567"), req(kStoreHello, "", store_i64_bytes(-1))}) {
    StoreState s2(kSecret);
    open_authed(s2, 7);
    EXPECT_EQ(feed(s2, 7, bad), Step::kClose) << bad.size();
  }
}

TEST(StoreProtocol, RepliesStayInOrderBehindAParkedGet) {
  StoreState st(kSecret);
  open_authed(st, 1);
  open_authed(st, 2);
  // Client 1 pipelines a GET of a missing key and a CHECK: the CHECK waits for the GET.
  EXPECT_EQ(feed(st, 1, req(kStoreGet, "k") + req(kStoreCheck, "k")), Step::kProgress);
  EXPECT_TRUE(replies(st, 1).empty());
  EXPECT_FALSE(st.wants_input(1));  // a whole request is queued behind the parked GET
  feed(st, 2, req(kStoreSet, "k", "v"));
  EXPECT_EQ(replies(st, 2), std::vector<std::string>{""});
  EXPECT_EQ(st.process(1), Step::kProgress);
  EXPECT_EQ(replies(st, 1), (std::vector<std::string>{"v", "1"}));
  EXPECT_TRUE(st.wants_input(1));
}

TEST(StoreProtocol, AClientThatDoesNotReadStopsBeingRead) {
  StoreLimits limits;
  limits.max_output = 1000;
  StoreState st(kSecret, limits);
  open_authed(st, 1);
  feed(st, 1, req(kStoreSet, "big", std::string(600, 'x')));
  replies(st, 1);
  std::string gets;
  for (int i = 0; i < 50; ++i) gets += req(kStoreGet, "big");
  feed(st, 1, gets);
  // Two replies fill the output; the other 48 requests wait, and nothing more is read.
  EXPECT_EQ(st.pending_output(1).size(), 2 * 604u);
  EXPECT_FALSE(st.wants_input(1));
  size_t answered = 0;
  while (!st.pending_output(1).empty()) {
    answered += replies(st, 1).size();
    st.process(1);
  }
  EXPECT_EQ(answered, 50u);
  EXPECT_TRUE(st.wants_input(1));
}

TEST(StoreProtocol, LostRanksInTheOrderTheyDropped) {
  StoreState st(kSecret);
  for (int id : {1, 2, 3}) {
    open_authed(st, id);
    feed(st, id, req(kStoreHello, "", store_i64_bytes(10 + id)));
    replies(st, id);
  }
  feed(st, 2, req(kStoreBye, ""));
  st.close(3);
  st.close(2);  // said goodbye: not lost
  st.close(1);
  EXPECT_EQ(st.lost(), (std::vector<int>{13, 11}));
}

TEST(StoreProtocol, CountersWrapInsteadOfOverflowing) {
  StoreState st(kSecret);
  open_authed(st, 1);
  feed(st, 1, req(kStoreAdd, "n", store_i64_bytes(INT64_MAX)) + req(kStoreAdd, "n", store_i64_bytes(1)));
  auto r = replies(st, 1);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(store_bytes_i64(r[1]), INT64_MIN);
}

}  // namespace
}  // namespace mt::comm
