#include "data/preprocess_pipeline.h"

#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <new>
#include <thread>

#include "core/error.h"
#include "data/preprocess_input.h"

namespace mt::data {

namespace {

class Pipeline {
 public:
  Pipeline(const std::vector<std::string>& files, const PipelineOptions& opts,
           const std::function<std::unique_ptr<BatchEncoder>()>& make_encoder)
      : files_(files), opts_(opts), make_encoder_(make_encoder),
        max_inflight_(static_cast<int64_t>(2 * opts.workers + 2)) {}

  ~Pipeline() { stop_and_join(); }

  void run(const std::function<void(EncodedBatch&)>& sink) {
    threads_.emplace_back([this] { guarded([this] { read_all(); }); });
    for (int w = 0; w < opts_.workers; ++w) threads_.emplace_back([this] { guarded([this] { work(); }); });
    try {
      for (int64_t next = 0;; ++next) {
        EncodedBatch batch;
        {
          std::unique_lock<std::mutex> lk(m_);
          cv_result_.wait(lk, [&] { return abort_ || done_.count(next) || (reader_done_ && next == total_); });
          if (abort_) break;
          if (!done_.count(next)) break;  // every batch has been delivered
          batch = std::move(done_[next]);
          done_.erase(next);
          --inflight_;
        }
        cv_space_.notify_one();
        sink(batch);
      }
    } catch (...) {
      record(std::current_exception());
    }
    stop_and_join();
    if (error_) std::rethrow_exception(error_);
  }

 private:
  template <typename F>
  void guarded(F&& f) {
    try {
      f();
    } catch (...) {
      record(std::current_exception());
    }
  }

  void record(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lk(m_);
      if (!error_) error_ = e;
      abort_ = true;
    }
    cv_work_.notify_all();
    cv_result_.notify_all();
    cv_space_.notify_all();
  }

  void stop_and_join() {
    {
      std::lock_guard<std::mutex> lk(m_);
      if (!finished_cleanly()) abort_ = true;  // e.g. the caller is unwinding
    }
    cv_work_.notify_all();
    cv_result_.notify_all();
    cv_space_.notify_all();
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
    threads_.clear();
  }

  bool finished_cleanly() const { return reader_done_ && work_.empty() && done_.empty(); }

  // Blocks until the batch may enter the pipeline; false when the run is aborting.
  bool push(LineBatch&& b) {
    std::unique_lock<std::mutex> lk(m_);
    cv_space_.wait(lk, [&] { return abort_ || inflight_ < max_inflight_; });
    if (abort_) return false;
    ++inflight_;
    work_.push_back(std::move(b));
    cv_work_.notify_one();
    return true;
  }

  void read_all() {
    int64_t seq = 0, global = 0;
    for (size_t f = 0; f < files_.size(); ++f) {
      LineReader reader(files_[f]);
      LineBatch b;
      std::string line;
      auto flush = [&]() -> bool {
        if (b.lines.empty()) return true;
        b.seq = seq++;
        if (!push(std::move(b))) return false;
        b = LineBatch();
        return true;
      };
      while (reader.next(line)) {
        if (b.lines.empty()) {
          b.file = f;
          b.first_line = reader.line_number();
          b.first_global = global;
        }
        b.bytes += line.size() + 1;
        b.lines.push_back(std::move(line));
        line = std::string();
        ++global;
        if (b.lines.size() >= opts_.batch_lines || b.bytes >= opts_.batch_bytes) {
          if (!flush()) return;
        }
      }
      if (!flush()) return;  // batches never span files, so errors name one file
    }
    std::lock_guard<std::mutex> lk(m_);
    total_ = seq;
    reader_done_ = true;
    cv_work_.notify_all();
    cv_result_.notify_all();
  }

  void work() {
    std::unique_ptr<BatchEncoder> enc = make_encoder_();
    for (;;) {
      LineBatch b;
      {
        std::unique_lock<std::mutex> lk(m_);
        cv_work_.wait(lk, [&] { return abort_ || !work_.empty() || reader_done_; });
        if (abort_) return;
        if (work_.empty()) return;  // reader done and nothing left
        b = std::move(work_.front());
        work_.pop_front();
      }
      EncodedBatch out = encode(*enc, b);
      out.seq = b.seq;
      out.file = b.file;
      out.first_line = b.first_line;
      out.first_global = b.first_global;
      out.bytes = b.bytes;
      {
        std::lock_guard<std::mutex> lk(m_);
        done_.emplace(out.seq, std::move(out));
      }
      cv_result_.notify_all();
    }
  }

  // Running out of memory is named with the lines that caused it (a worker's bad_alloc would
  // otherwise reach the user without a hint).
  EncodedBatch encode(BatchEncoder& enc, const LineBatch& b) {
    try {
      return enc.encode(b);
    } catch (const std::bad_alloc&) {
      fail("{}: ran out of memory encoding lines {}-{} ({} bytes); use fewer --workers, split very long "
           "lines, or give it more memory", files_[b.file], b.first_line,
           b.first_line + static_cast<int64_t>(b.lines.size()) - 1, b.bytes);
    }
  }

  const std::vector<std::string>& files_;
  const PipelineOptions opts_;
  const std::function<std::unique_ptr<BatchEncoder>()>& make_encoder_;
  const int64_t max_inflight_;

  std::mutex m_;
  std::condition_variable cv_work_, cv_result_, cv_space_;
  std::deque<LineBatch> work_;
  std::map<int64_t, EncodedBatch> done_;
  int64_t inflight_ = 0, total_ = -1;
  bool reader_done_ = false, abort_ = false;
  std::exception_ptr error_;
  std::vector<std::thread> threads_;
};

}  // namespace

void run_pipeline(const std::vector<std::string>& files, const PipelineOptions& opts,
                  const std::function<std::unique_ptr<BatchEncoder>()>& make_encoder,
                  const std::function<void(EncodedBatch&)>& sink) {
  MT_CHECK(opts.workers >= 1, "workers = {}", opts.workers);
  Pipeline p(files, opts, make_encoder);
  p.run(sink);
}

}  // namespace mt::data
