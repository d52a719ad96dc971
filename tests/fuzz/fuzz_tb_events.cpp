// libFuzzer target: a TensorBoard event file (TFRecord framing with CRC32C, then Event messages
// in protobuf's wire format), as read_event_file reads it. Whatever it accepts re-encodes to
// records that read back to the same scalars.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "training/tb_event_codec.h"
#include "training/tfrecord.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> records;
  try {
    records = mt::tfrecord::read_records(bytes, "fuzz", uint64_t{1} << 20);
  } catch (const mt::Error&) {
    return 0;
  }
  for (const std::string& r : records) {
    mt::tb::Event e;
    try {
      e = mt::tb::decode(r, "fuzz");
    } catch (const mt::Error&) {
      continue;
    }
    const mt::tb::Event again = mt::tb::decode(mt::tb::encode(e), "fuzz");
    if (again.scalars.size() != e.scalars.size() || again.step != e.step || again.file_version != e.file_version)
      std::abort();
  }
  return 0;
}
