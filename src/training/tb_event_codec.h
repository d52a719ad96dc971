#pragma once
// TensorBoard's Event message in protobuf's wire format, for the few fields scalar logging uses
// (schema and field numbers: proto/tensorboard_event.proto, TensorBoard's own numbers).
//
// Why not libprotobuf: Debian's SentencePiece library, which the tokenizers link, exports its
// own bundled copy of protobuf's internals, and a process that also loads libprotobuf.so crashes
// in protobuf's static initialisers (the two copies' symbols interpose). The messages here are
// four fields deep, so they are encoded and decoded directly; tests check the bytes against
// `protoc --decode` (a separate process) and TensorBoard's reader (tests/tools/read_tb_events.py).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mt::tb {

struct Scalar {
  std::string tag;
  float value = 0;
};

struct Event {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;     // set: a file-version event
  std::vector<Scalar> scalars;  // Summary.value entries with a simple_value
};

std::string encode(const Event& e);
// Fails (mt::Error naming `what`) on bytes that are not a well-formed Event: truncated fields,
// lengths past the end, wire types the schema does not allow for a known field. Unknown fields
// are skipped, as protobuf does.
Event decode(std::string_view bytes, const std::string& what);

}  // namespace mt::tb
