// The .npy reader on hostile headers: shapes whose element or byte count overflows, shapes
// that do not match the data, and files that are not regular files. Valid arrays round-trip.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <string>

#include "core/error.h"
#include "data/numpy_npy.h"
#include "data/reference/data_test_util.h"

namespace mt::data {
namespace {

using testing::TempDir;

// A version 1.0 .npy file with the given header dict and `data` after it.
std::string npy(const std::string& dict, const std::string& data = "") {
  std::string h = dict;
  h.append((64 - (10 + h.size() + 1) % 64) % 64, ' ');
  h.push_back('\n');
  std::string out("\x93NUMPY\x01\x00", 8);
  out.push_back(static_cast<char>(h.size() & 0xff));
  out.push_back(static_cast<char>(h.size() >> 8));
  return out + h + data;
}

std::string load_error(const std::string& path) {
  try {
    NpyArray::load(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Npy, RoundTrips) {
  TempDir dir;
  NpyArray a("<i4", {3, 2});
  for (int64_t i = 0; i < 6; ++i) a.set(i, i * 7 - 10);
  a.save(dir / "a.npy");
  const NpyArray b = NpyArray::load(dir / "a.npy");
  EXPECT_EQ(b.shape(), (std::vector<int64_t>{3, 2}));
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(b.at(i), i * 7 - 10);
}

// (2^62, 4) wrapped to 0 elements and passed as an empty array of 2^62 rows (a crash later).
TEST(Npy, OverflowingShapeIsRefused) {
  TempDir dir;
  testing::write_bytes(dir / "a.npy", npy("{'descr': '<i8', 'fortran_order': False, 'shape': (4611686018427387904, 4), }"));
  std::string e = load_error(dir / "a.npy");
  EXPECT_NE(e.find("a.npy"), std::string::npos) << e;
  EXPECT_NE(e.find("too large"), std::string::npos) << e;
  // The element count fits but its bytes do not.
  testing::write_bytes(dir / "b.npy", npy("{'descr': '<i8', 'fortran_order': False, 'shape': (2305843009213693952, 2), }"));
  e = load_error(dir / "b.npy");
  EXPECT_NE(e.find("too large"), std::string::npos) << e;
  // An empty dimension makes a valid empty array, whatever the others say.
  testing::write_bytes(dir / "c.npy", npy("{'descr': '<i8', 'fortran_order': False, 'shape': (0, 4611686018427387904), }"));
  EXPECT_EQ(NpyArray::load(dir / "c.npy").numel(), 0);
}

TEST(Npy, ShapeMustMatchTheData) {
  TempDir dir;
  const std::string d = "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }";
  testing::write_bytes(dir / "a.npy", npy(d, std::string(20, '\0')));
  EXPECT_NE(load_error(dir / "a.npy").find("needs 24 data bytes, the file has 20"), std::string::npos);
  testing::write_bytes(dir / "a.npy", npy(d, std::string(28, '\0')));
  EXPECT_NE(load_error(dir / "a.npy").find("needs 24 data bytes, the file has 28"), std::string::npos);
  testing::write_bytes(dir / "a.npy", npy("{'descr': '<i4', 'fortran_order': False, 'shape': 'xy', }"));
  EXPECT_NE(load_error(dir / "a.npy").find("no shape tuple"), std::string::npos);
  testing::write_bytes(dir / "a.npy", npy("{'descr': '<i4', 'fortran_order': False, 'shape': (2, -3), }"));
  EXPECT_NE(load_error(dir / "a.npy").find("malformed shape"), std::string::npos);
  testing::write_bytes(dir / "a.npy", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", "12345678"));
  EXPECT_NE(load_error(dir / "a.npy").find("dtype '<f4'"), std::string::npos);
}

TEST(Npy, NonRegularFilesAreRefused) {
  TempDir dir;
  ASSERT_EQ(::mkfifo((dir / "pipe.npy").c_str(), 0600), 0);
  EXPECT_NE(load_error(dir / "pipe.npy").find("not a regular file"), std::string::npos);
  EXPECT_NE(load_error(dir.path()).find("is a directory"), std::string::npos);
}

}  // namespace
}  // namespace mt::data
