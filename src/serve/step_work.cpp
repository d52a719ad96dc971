#include "serve/step_work.h"

#include <bit>

#include "core/error.h"

namespace mt::serve {
namespace {

// Message layout: [shutdown, n_fresh, per request..., n_cancel, ids...]; per request:
// [prompt_len, prompt..., max_new_tokens, temperature bits, top_k, top_p bits, seed, logprobs,
//  n_stop, stop ids...].
int64_t float_bits(float f) { return static_cast<int64_t>(std::bit_cast<uint32_t>(f)); }
float bits_float(int64_t w) { return std::bit_cast<float>(static_cast<uint32_t>(w)); }

class Reader {
 public:
  explicit Reader(const std::vector<int64_t>& w) : w_(w) {}
  int64_t next() {
    if (i_ >= w_.size()) fail("serve: a step message from rank 0 ends early (word {} of {}): do all ranks run the "
                              "same megatron binary?", i_, w_.size());
    return w_[i_++];
  }
  // A count that the rest of the message can hold (a garbled one must not allocate gigabytes).
  size_t count() {
    const int64_t n = next();
    if (n < 0 || static_cast<size_t>(n) > w_.size() - i_)
      fail("serve: a step message from rank 0 holds a count of {} with {} words left", n, w_.size() - i_);
    return static_cast<size_t>(n);
  }
  bool done() const { return i_ == w_.size(); }

 private:
  const std::vector<int64_t>& w_;
  size_t i_ = 0;
};

}  // namespace

std::vector<int64_t> encode_work(const StepWork& w) {
  std::vector<int64_t> out = {w.shutdown ? 1 : 0, static_cast<int64_t>(w.fresh.size())};
  for (const inference::Request& r : w.fresh) {
    MT_CHECK(r.stop_strings.empty(), "serve: stop strings are the HTTP layer's, not the engine's");
    out.push_back(static_cast<int64_t>(r.prompt.size()));
    out.insert(out.end(), r.prompt.begin(), r.prompt.end());
    out.push_back(r.max_new_tokens);
    out.push_back(float_bits(r.sampling.temperature));
    out.push_back(r.sampling.top_k);
    out.push_back(float_bits(r.sampling.top_p));
    out.push_back(static_cast<int64_t>(r.sampling.seed));
    out.push_back(r.logprobs ? 1 : 0);
    out.push_back(static_cast<int64_t>(r.stop_tokens.size()));
    out.insert(out.end(), r.stop_tokens.begin(), r.stop_tokens.end());
  }
  out.push_back(static_cast<int64_t>(w.cancel.size()));
  out.insert(out.end(), w.cancel.begin(), w.cancel.end());
  return out;
}

StepWork decode_work(const std::vector<int64_t>& words) {
  Reader in(words);
  StepWork w;
  w.shutdown = in.next() != 0;
  w.fresh.resize(in.count());
  for (inference::Request& r : w.fresh) {
    r.prompt.resize(in.count());
    for (int32_t& t : r.prompt) t = static_cast<int32_t>(in.next());
    r.max_new_tokens = in.next();
    r.sampling.temperature = bits_float(in.next());
    r.sampling.top_k = in.next();
    r.sampling.top_p = bits_float(in.next());
    r.sampling.seed = static_cast<uint64_t>(in.next());
    r.logprobs = in.next() != 0;
    r.stop_tokens.resize(in.count());
    for (int32_t& t : r.stop_tokens) t = static_cast<int32_t>(in.next());
  }
  w.cancel.resize(in.count());
  for (inference::RequestId& id : w.cancel) id = in.next();
  if (!in.done()) fail("serve: a step message from rank 0 has {} words past its end", words.size());
  return w;
}

void broadcast_work(comm::Communicator& c, StepWork& w) {
  std::vector<int64_t> words;
  if (c.rank() == 0) words = encode_work(w);
  int64_t n = static_cast<int64_t>(words.size());
  c.broadcast(&n, 1, comm::DataType::I64, 0);
  if (c.rank() != 0) {
    MT_CHECK(n >= 0 && n < (int64_t{1} << 32), "serve: rank 0 announced a step message of {} words", n);
    words.resize(static_cast<size_t>(n));
  }
  if (n > 0) c.broadcast(words.data(), words.size(), comm::DataType::I64, 0);
  if (c.rank() != 0) w = decode_work(words);
}

std::vector<inference::RequestId> apply_work(inference::Engine& e, StepWork& w, std::vector<std::string>* errors) {
  std::vector<inference::RequestId> ids;
  if (errors) errors->assign(w.fresh.size(), "");
  for (size_t i = 0; i < w.fresh.size(); ++i) {
    try {
      ids.push_back(e.submit(std::move(w.fresh[i])));
    } catch (const Error& err) {  // deterministic: every rank refuses the same request
      ids.push_back(0);
      if (errors) (*errors)[i] = err.what();
    }
  }
  for (inference::RequestId id : w.cancel) e.cancel(id);
  return ids;
}

void follow_engine(inference::Engine& e, comm::Communicator& c) {
  MT_CHECK(c.rank() != 0, "follow_engine runs on the ranks other than 0");
  for (;;) {
    StepWork w;
    broadcast_work(c, w);
    apply_work(e, w, nullptr);
    if (w.shutdown) return;
    if (!e.idle()) e.step();
  }
}

}  // namespace mt::serve
