#pragma once
// TensorBoard event files: Event messages (tb_event_codec.h, the schema in
// proto/tensorboard_event.proto) in TFRecord framing (tfrecord.h), named
// events.out.tfevents.<time>.<host>.<pid>.0 as TensorBoard's writers name them, so TensorBoard
// (and anything that reads its files) shows megatron.cpp's scalars.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mt {

class TensorBoardWriter {
 public:
  // Creates `dir` if needed and starts a new event file in it (first record: the file version).
  // `queue_size`: events kept in memory before they are written (Megatron's
  // --tensorboard-queue-size); flush() writes them at once.
  TensorBoardWriter(const std::string& dir, int64_t queue_size);
  ~TensorBoardWriter();
  void add_scalar(const std::string& tag, double value, int64_t step);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void append(const std::string& event_bytes);
  std::string path_;
  int64_t queue_size_;
  std::vector<std::string> queue_;  // framed records not yet written
};

// An event file read back (tests and tools): its version string and scalars in file order.
struct ScalarEvent {
  int64_t step = 0;
  double wall_time = 0;
  std::string tag;
  float value = 0;
};
struct EventFile {
  std::string file_version;
  std::vector<ScalarEvent> scalars;
};
// Fails (mt::Error naming the file) on a damaged record or a payload that is not an Event.
EventFile read_event_file(const std::string& path);
// The event files in `dir` (names holding "tfevents"), sorted.
std::vector<std::string> event_files(const std::string& dir);

}  // namespace mt
