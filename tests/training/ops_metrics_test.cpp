// Operating a run: TFRecord framing and Event encoding (read back with CRCs checked), a training
// run's TensorBoard scalars and JSON lines, the Prometheus text, Megatron's timer block, the
// straggler line, the NaN stop and the exit conditions' agreement.
#include <gtest/gtest.h>

#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "support/tiny_training.h"
#include "training/exit_conditions.h"
#include "training/metrics_server.h"
#include "training/straggler.h"
#include "training/tb_event_codec.h"
#include "training/tensorboard.h"
#include "training/tfrecord.h"
#include "training/timers.h"
#include "training/trainer.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

TEST(TfRecord, Crc32cKnownValue) {
  // The CRC-32C check value (RFC 3720, the iSCSI polynomial).
  EXPECT_EQ(tfrecord::crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(tfrecord::crc32c(""), 0u);
}

TEST(TfRecord, RoundTripAndDamageIsRefused) {
  std::string file = tfrecord::frame("hello") + tfrecord::frame("") + tfrecord::frame(std::string(300, 'x'));
  auto recs = tfrecord::read_records(file, "f");
  ASSERT_EQ(recs.size(), 3u);
  EXPECT_EQ(recs[0], "hello");
  EXPECT_EQ(recs[1], "");
  EXPECT_EQ(recs[2].size(), 300u);
  for (size_t at : {size_t{0}, size_t{9}, size_t{13}, size_t{19}}) {
    std::string bad = file;
    bad[at] = static_cast<char>(bad[at] ^ 0x40);
    EXPECT_THROW(tfrecord::read_records(bad, "f"), Error) << "flipped byte " << at;
  }
  EXPECT_THROW(tfrecord::read_records(file.substr(0, file.size() - 1), "f"), Error);
  EXPECT_THROW(tfrecord::read_records(file.substr(0, 5), "f"), Error);
}

TEST(TbEvent, EncodeDecodeRoundTrip) {
  tb::Event e;
  e.wall_time = 1234.5;
  e.step = 77;
  e.scalars = {{"lm loss", 2.5f}, {"grad-norm", 0.125f}};
  const tb::Event d = tb::decode(tb::encode(e), "x");
  EXPECT_EQ(d.wall_time, 1234.5);
  EXPECT_EQ(d.step, 77);
  ASSERT_EQ(d.scalars.size(), 2u);
  EXPECT_EQ(d.scalars[1].tag, "grad-norm");
  EXPECT_EQ(d.scalars[1].value, 0.125f);
  // Known bytes: field 2 (step) as varint 77, field 3 (file_version) length-delimited.
  tb::Event v;
  v.step = 77;
  v.file_version = "brain.Event:2";
  const std::string b = tb::encode(v);
  EXPECT_NE(b.find(std::string("\x10\x4d", 2)), std::string::npos);
  EXPECT_NE(b.find("\x1a\x0d" "brain.Event:2"), std::string::npos);
  EXPECT_THROW(tb::decode(b.substr(0, b.size() - 2), "x"), Error);
  EXPECT_THROW(tb::decode(std::string("\x0a\x05" "ab", 4), "x"), Error);  // wrong wire type for wall_time
}

// A tiny run with every sink on; the event file is read back (CRCs checked) with the names
// Megatron writes.
TEST(RunMetrics, TrainingWritesTensorBoardAndJsonLines) {
  const fs::path dir = temp_dir("mt_tb");
  Arguments a = test::tiny_llama_args();
  a.tensorboard_dir = (dir / "tb").string();
  a.metrics_jsonl = (dir / "m.jsonl").string();
  a.log_interval = 2;
  a.eval_interval = 2;
  a.eval_iters = 1;
  a.train_iters = 4;
  a.log_params_norm = true;
  a.log_num_zeros_in_grad = true;
  a.log_timers_to_tensorboard = true;
  a.log_throughput = true;
  a.log_validation_ppl_to_tensorboard = true;
  a.timing_log_level = 1;
  validate_args(a, 40);
  {
    Trainer t(a, nullptr);
    t.set_data(std::make_unique<test::PatternSource>(a.model.seq_length),
               std::make_unique<test::PatternSource>(a.model.seq_length));
    ASSERT_EQ(t.run(), 0);
  }
  const auto files = event_files(a.tensorboard_dir);
  ASSERT_EQ(files.size(), 1u);
  const EventFile ev = read_event_file(files[0]);
  EXPECT_EQ(ev.file_version, "brain.Event:2");
  std::map<std::string, std::map<int64_t, float>> by_tag;
  for (const auto& s : ev.scalars) by_tag[s.tag][s.step] = s.value;
  for (const char* tag : {"learning-rate", "batch-size", "lm loss", "loss-scale", "grad-norm", "num-zeros",
                          "params-norm", "iteration-time", "throughput", "lm loss validation",
                          "lm loss validation ppl", "forward-backward-time", "optimizer-time",
                          "lm loss vs samples"})
    EXPECT_TRUE(by_tag.count(tag)) << tag;
  EXPECT_EQ(by_tag["lm loss"].size(), 4u);  // --tensorboard-log-interval 1
  EXPECT_EQ(by_tag["batch-size"][3], static_cast<float>(a.global_batch_size));
  EXPECT_EQ(by_tag["iteration-time"].size(), 2u);  // at the log lines
  // "vs samples" curves are indexed by consumed samples.
  EXPECT_TRUE(by_tag["lm loss vs samples"].count(2 * a.global_batch_size));
  // The JSON lines agree with TensorBoard (as floats) on the per-interval values.
  std::ifstream j(a.metrics_jsonl);
  std::string line;
  int train_lines = 0, valid_lines = 0;
  while (std::getline(j, line)) {
    const auto o = nlohmann::json::parse(line);
    if (o["type"] == "train") {
      ++train_lines;
      const int64_t it = o["iteration"];
      EXPECT_EQ(static_cast<float>(o["grad_norm"].get<double>()), by_tag["grad-norm"][it]);
      EXPECT_EQ(static_cast<float>(o["params_norm"].get<double>()), by_tag["params-norm"][it]);
      EXPECT_TRUE(o.contains("timers_max_s"));
    } else {
      ++valid_lines;
      EXPECT_EQ(static_cast<float>(o["lm_loss"].get<double>()), by_tag["lm loss validation"][o["iteration"]]);
    }
  }
  EXPECT_EQ(train_lines, 2);
  EXPECT_GE(valid_lines, 2);
  fs::remove_all(dir);
}

TEST(TensorBoardWriter, QueueHoldsEventsUntilFull) {
  const fs::path dir = temp_dir("mt_tbq");
  TensorBoardWriter w(dir.string(), 3);
  const auto size = [&] { return fs::file_size(w.path()); };
  const auto first = size();  // the file version, written at once
  w.add_scalar("a", 1, 1);
  w.add_scalar("a", 2, 2);
  EXPECT_EQ(size(), first);
  w.add_scalar("a", 3, 3);  // the third fills the queue
  EXPECT_GT(size(), first);
  w.add_scalar("a", 4, 4);
  w.flush();
  EXPECT_EQ(read_event_file(w.path()).scalars.size(), 4u);
  fs::remove_all(dir);
}

TEST(Prometheus, TextFormat) {
  std::map<std::string, MetricSample> m;
  m["megatron:grad_norm"] = {1.5, "gradient norm", "gauge"};
  m["megatron:nan_iterations_total"] = {2, "nan iterations", "counter"};
  m["megatron:lm_loss"] = {std::nan(""), "loss", "gauge"};
  const std::string t = prometheus_text(m);
  EXPECT_NE(t.find("# HELP megatron:grad_norm gradient norm\n# TYPE megatron:grad_norm gauge\nmegatron:grad_norm 1.5\n"),
            std::string::npos);
  EXPECT_NE(t.find("# TYPE megatron:nan_iterations_total counter\nmegatron:nan_iterations_total 2\n"), std::string::npos);
  EXPECT_NE(t.find("megatron:lm_loss NaN\n"), std::string::npos);
}

TEST(Straggler, NamesSlowestAndFastest) {
  const std::string s = format_straggler({10.0, 14.0, 9.0, 12.0}, 2);
  EXPECT_NE(s.find("MnRtt/Rnk: 9.00ms/2"), std::string::npos) << s;
  EXPECT_NE(s.find("MxRtt/Rnk: 14.00ms/1"), std::string::npos) << s;
  EXPECT_NE(s.find("slowest: 1 (14.00 ms), 3 (12.00 ms)"), std::string::npos) << s;
  EXPECT_NE(s.find("fastest: 2 (9.00 ms), 0 (10.00 ms)"), std::string::npos) << s;
  EXPECT_NE(s.find("spread: 55.6%"), std::string::npos) << s;
}

TEST(Timers, MegatronBlockPerOption) {
  for (const char* opt : {"max", "minmax", "all"}) {
    Timers t(1, opt, nullptr, false);
    t.start("forward-backward");
    t.stop("forward-backward");
    t.start("forward-compute");  // level 2: off at level 1
    t.stop("forward-compute");
    const Timers::Report r = t.report(1);
    ASSERT_EQ(r.max_seconds.size(), 1u) << opt;
    EXPECT_EQ(r.max_seconds[0].first, "forward-backward");
    const std::string head = std::string(opt) == "max"      ? "max time across ranks (ms):\n    forward-backward ..."
                             : std::string(opt) == "minmax" ? "(min, max) time across ranks (ms):\n    forward-backward ..."
                                                            : "times across ranks (ms):\n  forward-backward:\n     rank  0: ";
    EXPECT_EQ(r.text.rfind(head, 0), 0u) << r.text;
    EXPECT_TRUE(t.report(1).text.empty());  // reset after a report
  }
}

TEST(Numerics, NanLossStopsNamingIterationAndRank) {
  Arguments a = test::tiny_llama_args();
  a.train_iters = 5;
  validate_args(a, 40);
  ::setenv("MT_TEST_NAN_LOSS", "3:0", 1);
  Trainer t(a, nullptr);
  t.set_data(std::make_unique<test::PatternSource>(a.model.seq_length), nullptr);
  (void)t.train_step();
  (void)t.train_step();
  try {
    (void)t.train_step();
    ADD_FAILURE() << "no stop at iteration 3";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("iteration 3: the lm loss is nan on rank 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--no-check-for-nan-in-loss-and-grad"), std::string::npos) << e.what();
  }
  // Opting out: the step is skipped and counted instead.
  a.check_for_nan_in_loss_and_grad = false;
  Trainer s(a, nullptr);
  s.set_data(std::make_unique<test::PatternSource>(a.model.seq_length), nullptr);
  for (int i = 0; i < 3; ++i) (void)s.train_step();
  ::unsetenv("MT_TEST_NAN_LOSS");
  EXPECT_EQ(s.state().nan_iterations, 1);
  EXPECT_EQ(s.state().skipped_iterations, 1);
}

TEST(ExitConditions, SignalAndDuration) {
  OpsArgs a;
  a.exit_signal_handler = true;
  a.exit_signal = "SIGUSR2";
  {
    ExitConditions e(a, nullptr);
    EXPECT_FALSE(e.check(1).has_value());
    std::raise(SIGUSR2);  // handled: the process goes on
    const auto why = e.check(2);
    ASSERT_TRUE(why.has_value());
    EXPECT_NE(why->find("received SIGUSR2 (--exit-signal-handler)"), std::string::npos) << *why;
  }
  OpsArgs d;
  d.exit_duration_in_mins = 3;
  ::setenv("MT_TEST_MINUTES_PER_ITERATION", "1", 1);
  ExitConditions e(d, nullptr);
  ::unsetenv("MT_TEST_MINUTES_PER_ITERATION");
  EXPECT_FALSE(e.check(2).has_value());
  ASSERT_TRUE(e.check(3).has_value());
  EXPECT_NE(e.check(3)->find("--exit-duration-in-mins 3"), std::string::npos);
  EXPECT_THROW(exit_signal_number("SIGFOO"), Error);
}

}  // namespace
}  // namespace mt
