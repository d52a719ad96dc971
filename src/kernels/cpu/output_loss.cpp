// The output layer and its cross-entropy in one chunked pass, for the CPU training head.
//
// The unfused path writes the [tokens, vocab] logits (200 MB for 1024 tokens of GPT-2's
// vocabulary), reads them back for the max, the exp sum, the gradient, and twice more for the
// two backward GEMMs. Here the rows go kRows at a time, and each chunk's vocabulary goes
// kVocabTile columns at a time, a tile that stays in L2 from its GEMM through its softmax work:
//  A. per tile: logits = x_c w_t^T; each row's max over the tile, exp(logit - tile max) in place
//     and its sum; the target's logit where the tile holds it;
//  B. per row: the row max, the sum exp(tile max - row max) * tile sum over tiles in order, so
//     lse and the loss, and for every tile the factor turning its exp values into softmax * dloss;
//  C. per tile: the gradient in place (exp * factor, minus dloss at the target), dw_t += g^T x_c
//     and a partial dx_c = g w_t;
//  D. per row: dx_c = the tiles' partials summed in tile order.
// One exp per logit, the logits of one chunk (not of the micro-batch) alive at a time, and the
// same three GEMMs as the unfused path. Determinism: tiles and chunks are fixed by the shapes,
// every GEMM call is single-threaded over at most blas::kKChunk of reduction, and every sum runs
// in a fixed order, so threads only decide who computes a tile, never how.
#include "kernels/cpu/output_loss.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/softmax_rows.h"
#include "kernels/cpu/vec_math.h"

namespace mt::cpu {

namespace {

// Rows per chunk: dw's reduction chunk in linear_backward, so dw sums the same row groups.
constexpr int64_t kRows = blas::kKChunk;
// 128 rows x 512 columns of fp32 = 256 KiB: the tile, its w rows and its dw rows fit in L2.
constexpr int64_t kVocabTile = 512;

template <typename T>
class ChunkedHead {
 public:
  ChunkedHead(const OutputLoss<T>& p, T* losses, T* lse)
      : p_(p), losses_(losses), lse_(lse), tiles_((p.V + kVocabTile - 1) / kVocabTile), rows_(std::min(p.N, kRows)) {
    buf_.reset(new T[static_cast<size_t>(rows_ * p.V)]);  // every element is written before it is read
    tile_max_.resize(static_cast<size_t>(tiles_ * rows_));
    tile_sum_.resize(tile_max_.size());
    factor_.resize(tile_max_.size());
    target_logit_.resize(static_cast<size_t>(rows_));
    if (p.dloss) dx_part_.resize(static_cast<size_t>(tiles_ * rows_ * p.H));
  }

  void run() {
    blas::single_threaded();
    for (int64_t r0 = 0; r0 < p_.N; r0 += kRows) {
      const int64_t R = std::min(kRows, p_.N - r0);
#pragma omp parallel if (R * p_.V * p_.H > (int64_t{1} << 18))
      {
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < tiles_; ++t) logits_tile(t, r0, R);
#pragma omp for schedule(static)
        for (int64_t i = 0; i < R; ++i) combine_row(i, r0);
        if (p_.dloss) {
#pragma omp for schedule(dynamic, 1)
          for (int64_t t = 0; t < tiles_; ++t) gradient_tile(t, r0, R);
#pragma omp for schedule(static)
          for (int64_t i = 0; i < R; ++i) sum_dx_row(i, r0);
        }
      }
    }
  }

 private:
  int64_t col0(int64_t t) const { return t * kVocabTile; }
  int64_t width(int64_t t) const { return std::min(kVocabTile, p_.V - col0(t)); }
  // Columns of tile t inside the softmax.
  int64_t valid(int64_t t) const { return std::clamp<int64_t>(p_.valid_v - col0(t), 0, width(t)); }
  T* tile(int64_t t) { return buf_.get() + t * kVocabTile * rows_; }  // [R, width(t)], row-major
  size_t at(int64_t t, int64_t i) const { return static_cast<size_t>(t * rows_ + i); }

  // A: the tile's logits, then per row the tile max, exp(logit - max) in place and its sum.
  void logits_tile(int64_t t, int64_t r0, int64_t R) {
    const int64_t c0 = col0(t), vt = width(t), nv = valid(t);
    T* L = tile(t);
    blas::gemm_chunked_k(false, true, R, vt, p_.H, p_.x + r0 * p_.H, p_.H, p_.w + c0 * p_.H, p_.H, T(0), L, vt);
    for (int64_t i = 0; i < R; ++i) {
      T* row = L + i * vt;
      const int64_t target = p_.targets[r0 + i];
      if (target >= c0 && target < c0 + vt) target_logit_[static_cast<size_t>(i)] = row[target - c0];
      const ExpSum e = exp_sum_row(row, nv);
      tile_max_[at(t, i)] = e.max;
      tile_sum_[at(t, i)] = e.sum;
    }
  }

  // B: the row's lse and loss from the tiles' maxima and sums, in tile order.
  void combine_row(int64_t i, int64_t r0) {
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t t = 0; t < tiles_; ++t) m = std::max(m, tile_max_[at(t, i)]);
    double sum = 0;
    for (int64_t t = 0; t < tiles_; ++t) {
      // A tile wholly of padding has max -inf and sum 0: its factor is 0.
      const double scale = tile_sum_[at(t, i)] > 0 ? vec::exp_scalar(tile_max_[at(t, i)] - m) : 0.0;
      factor_[at(t, i)] = scale;
      sum += tile_sum_[at(t, i)] * scale;
    }
    const T l = static_cast<T>(m) + static_cast<T>(std::log(sum));
    lse_[r0 + i] = l;
    losses_[r0 + i] = l - target_logit_[static_cast<size_t>(i)];
    if (!p_.dloss) return;
    // softmax_j * dloss = exp(logit_j - tile max) * exp(tile max - row max) / sum * dloss.
    const double g = static_cast<double>(p_.dloss[r0 + i]) / sum;
    for (int64_t t = 0; t < tiles_; ++t) factor_[at(t, i)] *= g;
  }

  // C: the tile's gradient in place, its share of dw (its own rows of dw) and its partial dx.
  void gradient_tile(int64_t t, int64_t r0, int64_t R) {
    const int64_t c0 = col0(t), vt = width(t), nv = valid(t);
    T* G = tile(t);
    for (int64_t i = 0; i < R; ++i) {
      T* row = G + i * vt;
      scale_row(row, nv, static_cast<T>(factor_[at(t, i)]));
      std::fill(row + nv, row + vt, T(0));
      const int64_t target = p_.targets[r0 + i];
      if (target >= c0 && target < c0 + vt) row[target - c0] -= p_.dloss[r0 + i];
    }
    const T* xc = p_.x + r0 * p_.H;
    const T beta = r0 == 0 && !p_.accumulate_dw ? T(0) : T(1);
    blas::gemm_chunked_k(true, false, vt, p_.H, R, G, vt, xc, p_.H, beta, p_.dw + c0 * p_.H, p_.H);
    blas::gemm_chunked_k(false, false, R, p_.H, vt, G, vt, p_.w + c0 * p_.H, p_.H, T(0),
                         dx_part_.data() + t * rows_ * p_.H, p_.H);
  }

  // D: dx of one row, the tiles' partials added in tile order.
  void sum_dx_row(int64_t i, int64_t r0) {
    const int64_t H = p_.H;
    T* d = p_.dx + (r0 + i) * H;
    const T* part = dx_part_.data() + i * H;
    std::copy(part, part + H, d);
    for (int64_t t = 1; t < tiles_; ++t) add_row(d, dx_part_.data() + (t * rows_ + i) * H, H);
  }

  const OutputLoss<T>& p_;
  T* losses_;
  T* lse_;
  const int64_t tiles_, rows_;
  std::unique_ptr<T[]> buf_;             // one chunk's logits, tile after tile
  std::vector<double> tile_max_;         // [tiles, rows] (float maxima, exact in double)
  std::vector<double> tile_sum_;         // [tiles, rows]: sum of exp(logit - tile max)
  std::vector<double> factor_;           // [tiles, rows]: exp(tile max - row max), then * dloss / sum
  std::vector<T> target_logit_;          // [rows]
  std::vector<T> dx_part_;               // [tiles, rows, H]
};

template <typename T>
void output_loss_impl(const OutputLoss<T>& p, T* losses, T* lse) {
  MT_CHECK(p.valid_v > 0 && p.valid_v <= p.V && p.H > 0, "output_loss: valid vocab {} of {}, hidden {}", p.valid_v,
           p.V, p.H);
  MT_CHECK(!p.dloss || (p.dx && p.dw), "output_loss: a gradient needs dx and dw");
  for (int64_t i = 0; i < p.N; ++i)
    MT_CHECK(p.targets[i] >= 0 && p.targets[i] < p.V, "output_loss: target {} outside [0, {})", p.targets[i], p.V);
  if (p.N == 0) {
    if (p.dloss && !p.accumulate_dw) std::fill(p.dw, p.dw + p.V * p.H, T(0));
    return;
  }
  ChunkedHead<T>(p, losses, lse).run();
}

}  // namespace

void output_loss(const OutputLoss<float>& p, float* losses, float* lse) { output_loss_impl(p, losses, lse); }
void output_loss(const OutputLoss<double>& p, double* losses, double* lse) { output_loss_impl(p, losses, lse); }

}  // namespace mt::cpu
