// libFuzzer target for the rendezvous store's protocol, as the server sees it (StoreState, the
// code TcpStoreServer runs for every byte a client sends). The input is the interleaved byte
// streams of three clients; the harness plays the server's socket loop: it feeds a client only
// while the server wants input from it, handles what can be handled after every step, and closes
// a client the protocol refuses. Findings: a crash, a sanitizer report, any exception (bad bytes
// close a connection, they never throw), or a connection holding more memory than the limits
// allow. Small limits let short inputs reach the caps.
//
// Input: chunks. A chunk starts with a byte h; client c = h % 4:
//   c = 0..2: the next h / 4 bytes (fewer at the end) arrive on client c;
//   c = 3:    one more byte b: client b % 3 reads all its replies (b & 4) or disconnects (else;
//             a new connection takes its place).
// Clients 0 and 1 present the secret when they connect (the harness does it, so that mutations
// reach the requests behind it); client 2 must send its own AUTH.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "comm/store_protocol.h"

namespace {

using mt::comm::StoreState;
using Step = StoreState::Step;

const std::string kSecret = "fuzz-store-secret";

mt::comm::StoreLimits fuzz_limits() {
  mt::comm::StoreLimits l;
  l.max_message = 2048;
  l.max_auth_message = 64;
  l.max_output = 1024;
  l.max_lost = 8;
  return l;
}

struct Harness {
  mt::comm::StoreLimits limits = fuzz_limits();
  StoreState st{kSecret, limits};
  int ids[3] = {0, 1, 2};
  int next_id = 3;

  void connect(int c) {
    st.open(ids[c]);
    if (c == 2) return;
    const std::string auth = mt::comm::encode_store_request(mt::comm::kStoreAuth, "", kSecret);
    if (st.receive(ids[c], auth.data(), auth.size()) != Step::kProgress) std::abort();
  }
  void reconnect(int c) {
    st.close(ids[c]);
    ids[c] = next_id++;
    connect(c);
  }
  // What the server loop does after every event: handle until nothing moves, closing refusers.
  void settle() {
    for (bool progress = true; progress;) {
      progress = false;
      for (int c = 0; c < 3; ++c) {
        const Step s = st.process(ids[c]);
        if (s == Step::kClose) reconnect(c);
        progress |= s == Step::kProgress;
      }
    }
    // A partial request is at most a header and a body within the limit, the unread replies at
    // most the output cap plus one reply; buffers may have twice that capacity.
    const size_t bound = 4 * (8 + limits.max_message + limits.max_output + 255);
    for (int id : ids)
      if (st.buffered_bytes(id) > bound) std::abort();
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Harness h;
  for (int c = 0; c < 3; ++c) h.connect(c);
  size_t i = 0;
  while (i < size) {
    const uint8_t head = data[i++];
    const int c = head % 4;
    if (c == 3) {
      if (i >= size) break;
      const uint8_t b = data[i++];
      const int target = b % 3;
      if (b & 4) h.st.consume_output(h.ids[target], h.st.pending_output(h.ids[target]).size());
      else h.reconnect(target);
    } else {
      const size_t n = std::min<size_t>(head / 4, size - i);
      // The server reads a client only while it wants input; otherwise the bytes wait in the
      // kernel, which the harness models by dropping them.
      if (h.st.wants_input(h.ids[c]) &&
          h.st.receive(h.ids[c], reinterpret_cast<const char*>(data + i), n) == Step::kClose)
        h.reconnect(c);
      i += n;
    }
    h.settle();
  }
  for (int c = 0; c < 3; ++c) h.st.close(h.ids[c]);
  return 0;
}
