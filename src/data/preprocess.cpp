// `megatron preprocess`: JSONL -> PREFIX_{key}_document.bin/.idx, or --merge of datasets.
#include "data/preprocess.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <new>
#include <thread>

#include "core/error.h"
#include "data/indexed_dataset.h"
#include "data/preprocess_args.h"
#include "data/preprocess_encode.h"
#include "data/preprocess_input.h"
#include "data/preprocess_merge.h"
#include "data/preprocess_pipeline.h"
#include "data/tokenizer.h"

namespace mt::data {

namespace {

using Clock = std::chrono::steady_clock;

class Progress {
 public:
  explicit Progress(int64_t interval) : interval_(interval), start_(Clock::now()) {}
  // Megatron's line: printed whenever the document count reaches a multiple of the interval.
  void document(double bytes_so_far) {
    if (++docs_ % interval_ == 0) print("Processed", bytes_so_far);
  }
  void print(const char* what, double bytes) const {
    const double s = std::max(1e-9, std::chrono::duration<double>(Clock::now() - start_).count());
    std::fprintf(stderr, "%s %lld documents (%.1f docs/s, %.2f MB/s).\n", what,
                 static_cast<long long>(docs_), static_cast<double>(docs_) / s, bytes / s / 1024 / 1024);
  }
  int64_t docs() const { return docs_; }

 private:
  int64_t interval_, docs_ = 0;
  Clock::time_point start_;
};

std::string key_prefix(const PreprocessArgs& a, const std::string& key) {
  return a.output_prefix + "_" + key + "_document";
}

int run_preprocess(const std::vector<std::string>& args) {
  const PreprocessArgs a = parse_preprocess_args(args);
  if (a.help) {
    std::fputs(preprocess_help().c_str(), stdout);
    return 0;
  }
  if (!a.merge.empty()) {
    merge_datasets(expand_merge_inputs(a.merge), a.output_prefix);
    return 0;
  }

  const std::vector<std::string> files = expand_inputs(a.inputs);
  // Built once here so bad tokenizer flags fail before any thread starts.
  std::unique_ptr<Tokenizer> tok = build_tokenizer(a.tokenizer);
  if (a.append_eod && tok->eod() < 0) {
    fail("--append-eod: tokenizer {} has no EOD token; drop --append-eod or pick another tokenizer", tok->name());
  }
  const DType dtype = optimal_dtype(tok->vocab_size());
  const int workers = a.workers > 0 ? a.workers : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // Megatron's --partitions deals lines round-robin to N partition files and concatenates the
  // partitions' outputs; we reproduce that order (not the intermediate files).
  const bool round_robin = a.partitions > 1 && !a.keep_sequential_samples;
  const size_t parts = round_robin ? static_cast<size_t>(a.partitions) : 1;
  const size_t nkeys = a.json_keys.size();

  std::fprintf(stderr, "preprocess: %zu input file(s), %d worker(s), %s (vocab %lld, %s tokens)\n", files.size(),
               workers, tok->name().c_str(), static_cast<long long>(tok->vocab_size()), dtype_name(dtype));

  std::vector<std::vector<std::unique_ptr<IndexedDatasetWriter>>> writers(parts);
  for (size_t p = 0; p < parts; ++p) {
    for (const auto& key : a.json_keys) {
      const std::string prefix = round_robin ? key_prefix(a, key) + ".partition" + std::to_string(p) : key_prefix(a, key);
      writers[p].push_back(std::make_unique<IndexedDatasetWriter>(prefix, dtype));
    }
  }

  Progress progress(a.log_interval);
  double bytes = 0;
  int64_t skipped = 0;
  std::string first_skipped;
  auto sink = [&](EncodedBatch& b) {
    std::vector<size_t> tok_off(nkeys, 0), len_off(nkeys, 0), doc_off(nkeys, 0);
    const size_t n = b.errors.size();
    for (size_t i = 0; i < n; ++i) {
      const double here = bytes + static_cast<double>(b.bytes) * static_cast<double>(i + 1) / static_cast<double>(n);
      if (!b.errors[i].empty()) {
        const std::string where = files[b.file] + ":" + std::to_string(b.first_line + static_cast<int64_t>(i));
        if (!a.skip_malformed_lines) {
          fail("{}: {}; fix the line or pass --skip-malformed-lines to skip such lines", where, b.errors[i]);
        }
        if (skipped++ == 0) first_skipped = where + ": " + b.errors[i];
        continue;
      }
      const size_t p = round_robin ? static_cast<size_t>(b.first_global + static_cast<int64_t>(i)) % parts : 0;
      for (size_t k = 0; k < nkeys; ++k) {
        const KeyTokens& kt = b.keys[k];
        const uint32_t nseq = kt.nseq[doc_off[k]++];
        writers[p][k]->add_document(kt.tokens.data() + tok_off[k], kt.seq_lens.data() + len_off[k], nseq);
        for (uint32_t s = 0; s < nseq; ++s) tok_off[k] += static_cast<size_t>(kt.seq_lens[len_off[k] + s]);
        len_off[k] += nseq;
      }
      progress.document(here);
    }
    bytes += static_cast<double>(b.bytes);
  };
  PipelineOptions po;
  po.workers = workers;
  // The first worker reuses the tokenizer built above; the others build their own (a tokenizer
  // need not be thread-safe), in parallel inside their threads.
  std::mutex spare_mutex;
  std::unique_ptr<Tokenizer> spare = std::move(tok);
  auto make_encoder = [&] {
    std::unique_ptr<Tokenizer> t;
    {
      std::lock_guard<std::mutex> lk(spare_mutex);
      t = std::move(spare);
    }
    if (!t) t = build_tokenizer(a.tokenizer);
    return std::make_unique<JsonlEncoder>(std::move(t), a.json_keys, a.append_eod);
  };
  run_pipeline(files, po, make_encoder, sink);

  // Partition datasets are intermediate: removed on success and on failure alike.
  struct PartitionFiles {
    std::vector<std::string> prefixes;
    ~PartitionFiles() {
      for (const auto& p : prefixes) {
        std::remove(bin_path(p).c_str());
        std::remove(idx_path(p).c_str());
      }
    }
  } partition_files;
  for (auto& row : writers) {
    for (auto& w : row) {
      if (round_robin) partition_files.prefixes.push_back(w->prefix());  // before a half-done finalize
      w->finalize();
    }
  }
  for (size_t k = 0; k < nkeys; ++k) {
    std::unique_ptr<IndexedDatasetWriter> merged;
    const IndexedDatasetWriter* out = writers[0][k].get();
    if (round_robin) {
      merged = std::make_unique<IndexedDatasetWriter>(key_prefix(a, a.json_keys[k]), dtype);
      for (size_t p = 0; p < parts; ++p) merged->add_index(writers[p][k]->prefix());
      merged->finalize();
      out = merged.get();
    }
    std::fprintf(stderr, "wrote %s.{bin,idx}: %lld documents, %lld sequences, %lld tokens\n",
                 key_prefix(a, a.json_keys[k]).c_str(), static_cast<long long>(out->num_documents()),
                 static_cast<long long>(out->num_sequences()), static_cast<long long>(out->num_tokens()));
  }
  progress.print("Done:", bytes);
  if (skipped > 0) {
    std::fprintf(stderr, "skipped %lld malformed line(s); the first: %s\n", static_cast<long long>(skipped),
                 first_skipped.c_str());
  }
  return 0;
}

}  // namespace

int preprocess_main(const std::vector<std::string>& args) {
  // Any failure unwinds run_preprocess, whose writers remove their temporary files; exceptions
  // that are not the project's own (out of memory in a worker, a thread that cannot start)
  // become one clear error here instead of escaping and aborting without that clean-up.
  try {
    return run_preprocess(args);
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    fail("preprocess ran out of memory; use fewer --workers, split very long lines, or give it more "
         "memory (temporary files were removed)");
  } catch (const std::exception& e) {
    fail("preprocess failed: {} (temporary files were removed)", e.what());
  }
}

}  // namespace mt::data
