#pragma once
// The concurrent core of `megatron preprocess`: one reader thread cuts the input into batches
// of lines, worker threads encode batches, and the calling thread receives the encoded batches
// strictly in input order (so the output never depends on --workers). At most a fixed number
// of batches are in flight, which bounds memory whatever the input size. The first exception
// in any thread stops every thread and is rethrown to the caller; nothing waits forever.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace mt::data {

struct LineBatch {
  int64_t seq = 0;           // batch number, from 0
  size_t file = 0;           // index into the input file list
  int64_t first_line = 0;    // 1-based line number of lines[0] within its file
  int64_t first_global = 0;  // 0-based line index over all files (for --partitions)
  std::vector<std::string> lines;
  size_t bytes = 0;
};

// One JSON key's output for a batch: per line, nseq[i] sequences with lengths in seq_lens and
// tokens back to back in `tokens`.
struct KeyTokens {
  std::vector<int32_t> tokens, seq_lens;
  std::vector<uint32_t> nseq;
};

struct EncodedBatch {
  int64_t seq = 0;
  size_t file = 0;
  int64_t first_line = 0, first_global = 0;
  size_t bytes = 0;
  std::vector<std::string> errors;  // per line: "" = a document, else why the line is malformed
  std::vector<KeyTokens> keys;
};

class BatchEncoder {
 public:
  virtual ~BatchEncoder() = default;
  virtual EncodedBatch encode(const LineBatch& batch) = 0;
};

struct PipelineOptions {
  int workers = 1;
  size_t batch_lines = 1024;
  size_t batch_bytes = 1 << 20;
};

// Runs the pipeline over `files`. make_encoder is called once in each worker thread (so every
// worker owns its tokenizer); sink runs on the calling thread, in batch order.
void run_pipeline(const std::vector<std::string>& files, const PipelineOptions& opts,
                  const std::function<std::unique_ptr<BatchEncoder>()>& make_encoder,
                  const std::function<void(EncodedBatch&)>& sink);

}  // namespace mt::data
