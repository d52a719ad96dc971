#pragma once
// Reading a float32 .npy (numpy 1.0 header), as the HF fixtures' logits.npy are written.
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/error.h"

namespace mt::test {

// A float32 .npy (numpy 1.0 header).
inline std::vector<float> read_npy_f32(const std::string& path, std::vector<int64_t>* shape = nullptr) {
  std::ifstream f(path, std::ios::binary);
  std::string b((std::istreambuf_iterator<char>(f)), {});
  if (b.size() < 10 || b.compare(1, 5, "NUMPY") != 0) throw Error("not an npy file: " + path);
  uint16_t hl;
  std::memcpy(&hl, b.data() + 8, 2);
  const std::string header = b.substr(10, hl);
  if (header.find("'<f4'") == std::string::npos) throw Error("not float32: " + path);
  if (shape) {
    shape->clear();
    auto l = header.find("'shape': ("), r = header.find(')', l);
    std::string dims = header.substr(l + 10, r - l - 10);
    for (size_t p = 0; p < dims.size();) {
      size_t q = dims.find(',', p);
      std::string d = dims.substr(p, q == std::string::npos ? std::string::npos : q - p);
      if (d.find_first_not_of(' ') != std::string::npos) shape->push_back(std::stoll(d));
      if (q == std::string::npos) break;
      p = q + 1;
    }
  }
  std::vector<float> v((b.size() - 10 - hl) / 4);
  std::memcpy(v.data(), b.data() + 10 + hl, v.size() * 4);
  return v;
}

}  // namespace mt::test
