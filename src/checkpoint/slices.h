#pragma once
// Where the elements of a global tensor live in a sharded checkpoint. Every stored piece names a
// box of the global tensor (offset and extent per dimension) and the part of that box it holds
// as a flat range of the box's row-major order: a tensor-parallel shard is one box per block
// (fc1's [gate_r; up_r] is two), and a distributed-optimizer shard is a flat range of such a box.
// Loading copies the overlap of every stored piece with every box the loading rank needs, so any
// TP/PP/DP layout, with or without the distributed optimizer, reads any other.
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/params.h"

namespace mt::checkpoint {

struct Box {
  std::vector<int64_t> offset, extent;
  int64_t numel() const;
};

// A run of stored elements: elements [flat_lo, flat_hi) of `box`, in row-major order.
struct Piece {
  std::string file, key;
  Box box;
  int64_t flat_lo = 0, flat_hi = 0;
  int64_t numel() const { return flat_hi - flat_lo; }
};

struct TensorIndex {
  Shape shape;  // the global shape
  std::vector<Piece> pieces;
};

// The boxes of the global tensor a parameter's local (TP) shard holds, in the order its elements
// are laid out locally (the shard is their concatenation).
std::vector<Box> local_boxes(const model::Param& p);

// Copies the elements that the stored piece (src_box, elements [src_lo, src_hi) at `src`) shares
// with the wanted part of a destination box (dst_box, elements [dst_lo, dst_hi), written at
// `dst` + (flat index - dst_lo)). Returns the number of elements copied.
int64_t copy_overlap(const Box& src_box, int64_t src_lo, int64_t src_hi, const float* src, const Box& dst_box,
                     int64_t dst_lo, int64_t dst_hi, float* dst);

}  // namespace mt::checkpoint
