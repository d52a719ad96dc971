#pragma once
// Turns JSONL lines into token ids the way tools/preprocess_data.py's Encoder.encode does:
// each key's value is one text (or a list of pre-split sentences); every non-empty sentence
// becomes one sequence; with --append-eod the EOD id ends a non-empty document. A line that is
// not a JSON object with the keys as strings is reported, not thrown, so the caller can stop
// at (or skip) it with its file and line number.
#include <memory>
#include <string>
#include <vector>

#include "data/preprocess_pipeline.h"
#include "data/tokenizer.h"

namespace mt::data {

class JsonlEncoder final : public BatchEncoder {
 public:
  JsonlEncoder(std::unique_ptr<Tokenizer> tokenizer, std::vector<std::string> keys, bool append_eod);
  EncodedBatch encode(const LineBatch& batch) override;

 private:
  // "" when the line became a document, else the reason it is malformed.
  std::string encode_line(const std::string& line, EncodedBatch& out);

  std::unique_ptr<Tokenizer> tok_;
  std::vector<std::string> keys_;
  bool append_eod_;
  int32_t eod_;
  std::vector<std::string> sentences_;
};

}  // namespace mt::data
