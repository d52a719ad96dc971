#pragma once
// TFRecord framing, the container of TensorBoard event files: each record is
//   u64 length (little-endian) | u32 masked CRC32C of those 8 bytes | data | u32 masked CRC32C of data
// (masked: rotate right by 15, add 0xa282ead8). The payloads (Event protos) are tensorboard.h's.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mt::tfrecord {

uint32_t crc32c(std::string_view bytes);
uint32_t masked_crc32c(std::string_view bytes);
// One framed record around `data`.
std::string frame(std::string_view data);
// Every record of `bytes` in order. Fails (mt::Error naming `what`) on a truncated record, a
// length beyond the file or `max_record` bytes, or a CRC mismatch: event files are read back by
// tests and tools only, so a damaged one is an error rather than something to skip.
std::vector<std::string> read_records(std::string_view bytes, const std::string& what,
                                      uint64_t max_record = uint64_t{64} << 20);

}  // namespace mt::tfrecord
