#include "checkpoint/slices.h"

#include <algorithm>

#include "core/error.h"

namespace mt::checkpoint {

int64_t Box::numel() const {
  int64_t n = 1;
  for (int64_t e : extent) n *= e;
  return n;
}

std::vector<Box> local_boxes(const model::Param& p) {
  Box whole{std::vector<int64_t>(p.full_shape.size(), 0), p.full_shape};
  if (!p.tp.sharded()) return {whole};
  const size_t d = static_cast<size_t>(p.tp.dim);
  const int64_t block = p.full_shape[d] / p.tp.blocks, part = block / p.tp.size;
  // A split of dimension 0 keeps each block's part contiguous locally; a later dimension with
  // one block is a single box. (A later dimension with several blocks would interleave them per
  // row; no layer splits that way.)
  MT_CHECK(d == 0 || p.tp.blocks == 1, "{}: split of dim {} in {} blocks has no box layout", p.name, d, p.tp.blocks);
  std::vector<Box> out;
  for (int b = 0; b < p.tp.blocks; ++b) {
    Box box = whole;
    box.offset[d] = b * block + p.tp.rank * part;
    box.extent[d] = part;
    out.push_back(box);
  }
  return out;
}

int64_t copy_overlap(const Box& sb, int64_t src_lo, int64_t src_hi, const float* src, const Box& db, int64_t dst_lo,
                     int64_t dst_hi, float* dst) {
  const size_t nd = sb.extent.size();
  MT_CHECK(db.extent.size() == nd, "boxes of rank {} and {}", nd, db.extent.size());
  if (nd == 0) {  // a scalar: one element
    if (src_lo <= 0 && src_hi > 0 && dst_lo <= 0 && dst_hi > 0) {
      dst[0] = src[0 - src_lo];
      return 1;
    }
    return 0;
  }
  // The intersection box, in global coordinates.
  std::vector<int64_t> lo(nd), hi(nd);
  for (size_t i = 0; i < nd; ++i) {
    lo[i] = std::max(sb.offset[i], db.offset[i]);
    hi[i] = std::min(sb.offset[i] + sb.extent[i], db.offset[i] + db.extent[i]);
    if (lo[i] >= hi[i]) return 0;
  }
  std::vector<int64_t> s_stride(nd, 1), d_stride(nd, 1);
  for (size_t i = nd - 1; i-- > 0;) {
    s_stride[i] = s_stride[i + 1] * sb.extent[i + 1];
    d_stride[i] = d_stride[i + 1] * db.extent[i + 1];
  }
  // Walk the intersection's rows (all coordinates but the last); each row is one contiguous run
  // in both boxes, clipped to the flat ranges held and wanted.
  const int64_t run = hi[nd - 1] - lo[nd - 1];
  std::vector<int64_t> c(lo.begin(), lo.end());
  int64_t copied = 0;
  while (true) {
    int64_t sf = 0, df = 0;
    for (size_t i = 0; i < nd; ++i) {
      sf += (c[i] - sb.offset[i]) * s_stride[i];
      df += (c[i] - db.offset[i]) * d_stride[i];
    }
    const int64_t a = std::max({int64_t{0}, src_lo - sf, dst_lo - df});
    const int64_t b = std::min({run, src_hi - sf, dst_hi - df});
    if (a < b) {
      std::copy_n(src + (sf + a - src_lo), b - a, dst + (df + a - dst_lo));
      copied += b - a;
    }
    size_t i = nd - 1;  // next row: odometer over dims [0, nd-1)
    while (i-- > 0) {
      if (++c[i] < hi[i]) break;
      c[i] = lo[i];
    }
    if (i == static_cast<size_t>(-1)) break;
  }
  return copied;
}

}  // namespace mt::checkpoint
