// Pretrain's data section: the tokenizer and the datasets.
#include "core/error.h"
#include "model/config.h"
#include "training/arguments_sections.h"

namespace mt {
namespace {
namespace limits = model::limits;
}  // namespace

void register_data_flags(FlagParser& p, DataArgs& a) {
  p.value("--tokenizer-type", &a.tokenizer.type, "tokenizer",
          {"GPT2BPETokenizer", "HuggingFaceTokenizer", "SentencePieceTokenizer", "GPTSentencePieceTokenizer",
           "Llama2Tokenizer", "TikTokenizer", "NullTokenizer"});
  p.value("--vocab-file", &a.tokenizer.vocab_file, "GPT-2 encoder.json");
  p.value("--merge-file", &a.tokenizer.merge_file, "GPT-2 vocab.bpe");
  p.value("--tokenizer-model", &a.tokenizer.tokenizer_model, "tokenizer.json / directory / SentencePiece .model");
  p.value("--vocab-size", &a.tokenizer.vocab_size, "vocabulary size (NullTokenizer; TikTokenizer, default 131072)",
          {1, limits::kVocab});
  p.list("--data-path", &a.data.data_path, "PREFIX or W1 PREFIX1 W2 PREFIX2 ...");
  p.list("--train-data-path", &a.data.train_data_path, "data for the train split only");
  p.list("--valid-data-path", &a.data.valid_data_path, "data for the validation split only");
  p.list("--test-data-path", &a.data.test_data_path, "data for the test split only");
  p.value("--split", &a.data.split, "train,valid,test proportions (default 969, 30, 1)");
  p.value("--data-cache-path", &a.data.data_cache_path, "where dataset index caches are written");
  p.store_true("--mock-data", &a.data.mock, "synthetic data (Megatron's mock GPT dataset)");
  p.store_true("--eod-mask-loss", &a.eod_mask_loss, "no loss on end-of-document tokens");
}

void validate_data_args(const Arguments& a) {
  if (a.data.data_path.empty() && a.data.train_data_path.empty() && !a.data.mock)
    fail("no training data: give --data-path PREFIX (from 'megatron preprocess') or --mock-data");
  if (!a.data.mock && a.tokenizer.type.empty())
    fail("--tokenizer-type is required with --data-path (the tokenizer that made the data)");
}

}  // namespace mt
