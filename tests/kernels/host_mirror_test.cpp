// HostMirror (kernels/host_mirror.h): the values of several f32 tensors, in order, on the host,
// on the CPU (copied at start) and on the GPU (copied in stream order, read after wait); a second
// start reuses (or grows) the buffer.
#include "kernels/host_mirror.h"

#include <gtest/gtest.h>

#include "support/gpu.h"

namespace mt::ops {
namespace {

Tensor filled(const std::vector<float>& v, Device d) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::F32, Device::CPU);
  std::copy(v.begin(), v.end(), t.data<float>());
  return d == Device::CPU ? t : t.to_device(d);
}

void check_mirror(Device d) {
  HostMirror m;
  m.start({filled({1, 2, 3}, d), filled({}, d), filled({4.5f}, d)});
  EXPECT_EQ(m.wait(), (std::vector<float>{1, 2, 3, 4.5f}));
  m.start({filled({7, 8, 9, 10, 11, 12}, d)});  // more values than before: the buffer grows
  EXPECT_EQ(m.wait(), (std::vector<float>{7, 8, 9, 10, 11, 12}));
  m.start({filled({-1}, d)});
  EXPECT_EQ(m.wait(), (std::vector<float>{-1}));
  EXPECT_EQ(m.wait(), (std::vector<float>{-1}));  // waiting again returns the same values
}

TEST(HostMirror, CpuTensors) { check_mirror(Device::CPU); }

TEST(HostMirror, GpuTensors) {
  if (!test::have_gpu()) GTEST_SKIP() << "no GPU";
  test::gpu();
  check_mirror(Device::CUDA);
}

}  // namespace
}  // namespace mt::ops
