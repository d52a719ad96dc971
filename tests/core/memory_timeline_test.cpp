// The memory timeline (--record-memory-history): what the allocators report while recording, the
// bytes in use and the peak, frees of memory allocated before recording left out, the event cap,
// and the JSON lines written at the end.
#include "core/memory_timeline.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace mt {
namespace {

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

TEST(MemoryTimeline, RecordsTensorsInUseAndPeakPerIteration) {
  const std::string path = ::testing::TempDir() + "/mt_memory_timeline.jsonl";
  Tensor before = Tensor::zeros({256}, DType::F32);  // allocated before recording: its free is not counted
  memory_timeline::start();
  memory_timeline::set_iteration(1);
  {
    Tensor a = Tensor::zeros({1024}, DType::F32);  // 4 KiB
    Tensor b = Tensor::zeros({2048}, DType::F32);  // 8 KiB
    EXPECT_EQ(memory_timeline::peak(Device::CPU), 12288u);
  }
  memory_timeline::set_iteration(2);
  before = Tensor();
  Tensor c = Tensor::zeros({512}, DType::F32);  // 2 KiB: the peak stays 12 KiB
  EXPECT_EQ(memory_timeline::peak(Device::CPU), 12288u);
  memory_timeline::stop_and_write(path);
  EXPECT_FALSE(memory_timeline::recording());
  const auto lines = lines_of(path);
  // Five events (two allocations, their frees, one more allocation) and the summary.
  ASSERT_EQ(lines.size(), 6u) << (lines.empty() ? "" : lines[0]);
  EXPECT_NE(lines[0].find("\"iteration\": 1, \"device\": \"cpu\", \"bytes\": 4096, \"in_use\": 4096"),
            std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("\"bytes\": 8192, \"in_use\": 12288"), std::string::npos) << lines[1];
  EXPECT_NE(lines[4].find("\"iteration\": 2, \"device\": \"cpu\", \"bytes\": 2048, \"in_use\": 2048"),
            std::string::npos) << lines[4];
  EXPECT_NE(lines[5].find("\"summary\": {\"events\": 5, \"dropped\": 0, \"peak_in_use\": {\"cpu\": 12288, \"cuda\": 0}}"),
            std::string::npos) << lines[5];
  c = Tensor();  // after recording stopped: not counted, no error
  std::remove(path.c_str());
}

TEST(MemoryTimeline, KeepsAtMostTheCapAndCountsTheRest) {
  const std::string path = ::testing::TempDir() + "/mt_memory_timeline_cap.jsonl";
  memory_timeline::start(3);
  for (int i = 0; i < 4; ++i) Tensor t = Tensor::zeros({16}, DType::F32);  // 8 events, 3 kept
  EXPECT_EQ(memory_timeline::peak(Device::CPU), 64u);
  memory_timeline::stop_and_write(path);
  const auto lines = lines_of(path);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_NE(lines[3].find("\"events\": 3, \"dropped\": 5"), std::string::npos) << lines[3];
  std::remove(path.c_str());
}

TEST(MemoryTimeline, AnUnwritablePathNamesTheFlag) {
  memory_timeline::start();
  EXPECT_THROW(
      {
        try {
          memory_timeline::stop_and_write("/nonexistent_dir_mt/x.jsonl");
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("--memory-snapshot-path"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
}

}  // namespace
}  // namespace mt
