// Self-attention in the flash-attention style: per (batch, query head, query tile) the keys are
// streamed in tiles with a running row max and row sum (online softmax), so no S x S matrix is
// ever held; lse = max + log(sum) is saved and backward recomputes each probability tile from it.
//
// Determinism: every output element is produced by one thread in a fixed loop order. The
// backward has two schedules that give bit-identical results (same tile code, same order of
// accumulation per element):
//  * fused: one task per (batch, kv head) computes dq of its query heads and dk/dv together;
//    fewest flops, used when there are enough such tasks to keep the threads busy;
//  * split: tasks per (batch, kv head, key tile) compute dk/dv, then tasks per (batch, query
//    head, query tile) compute dq. Probabilities are recomputed twice, but the work spreads over
//    many more tasks (MQA, batch 1).
//
// Tiles live in zero-padded scratch buffers of fixed size, so the inner products are small
// register-blocked loops on explicit SSE2 vectors with no bounds tests; masked and padded
// probabilities are exact zeros and add nothing.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/philox.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"

namespace mt::cpu {

namespace {

constexpr int64_t kBq = 64;  // query rows per tile
constexpr int64_t kBk = 64;  // keys per tile
constexpr int64_t kR = 4;    // rows per register block
template <typename T>
constexpr int64_t kC = 32 / sizeof(T);  // columns per register block (two 16-byte vectors)

constexpr int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Below this many score multiply-adds a call runs on one thread: waking a team costs more than
// the work (and finite-difference tests make thousands of such calls).
bool worth_threads(const ops::AttentionShape& p) { return p.B * p.Hq * p.S * p.keys() * p.D >= (int64_t{1} << 18); }

void check_params(const ops::AttentionShape& p) {
  MT_CHECK(p.B >= 0 && p.S >= 0 && p.D > 0 && p.Hkv > 0 && p.Hq % p.Hkv == 0 && p.keys() >= 0,
           "bad attention shape B={} Hq={} Hkv={} S={} Sk={} D={}", p.B, p.Hq, p.Hkv, p.S, p.keys(), p.D);
  MT_CHECK(p.q_pos >= 0 && p.k_pos >= 0 && p.q_pos + p.S <= p.total() && p.k_pos + p.keys() <= p.total(),
           "attention chunk outside its sequence: queries [{}, +{}), keys [{}, +{}) of {}", p.q_pos, p.S, p.k_pos,
           p.keys(), p.total());
  MT_CHECK(!p.cu_seqlens || (p.num_segments >= p.B && p.cu_seqlens[0] == 0 &&
                             p.cu_seqlens[p.num_segments] == p.B * p.total()),
           "cu_seqlens of {} segments does not cover {} samples of {}", p.num_segments, p.B, p.total());
}

// Philox draws u[j] = uniform(seed, offset, idx0 + j) for j < n, one block of 4 at a time.
void philox_range(uint64_t seed, uint64_t offset, uint64_t idx0, int64_t n, float* u) {
  int64_t j = 0;
  while (j < n) {
    const uint64_t idx = idx0 + static_cast<uint64_t>(j);
    const auto blk = Philox::uniform4(seed, offset, idx / 4);
    for (uint64_t l = idx % 4; l < 4 && j < n; ++l, ++j) u[j] = blk[l];
  }
}

// The keys each row of a query tile sees ([lo, hi), chunk-local key indices), and the span
// [lo, hi) of all of them (empty when no row sees a key).
struct RowRanges {
  int64_t lo[kBq], hi[kBq];
  int64_t span_lo = 0, span_hi = 0;
  void fill(const ops::AttentionShape& p, int64_t b, int64_t i0, int64_t nq) {
    span_lo = p.keys();
    span_hi = 0;
    for (int64_t i = 0; i < nq; ++i) {
      const ops::KeyRange r = ops::visible_keys(p, b, i0 + i);
      lo[i] = r.lo;
      hi[i] = r.hi;
      if (r.hi > r.lo) {
        span_lo = std::min(span_lo, r.lo);
        span_hi = std::max(span_hi, r.hi);
      }
    }
    if (span_hi <= span_lo) span_lo = span_hi = 0;
  }
  // Key tiles [first, last] the rows meet (first > last: none).
  int64_t first_tile() const { return span_lo / kBk; }
  int64_t last_tile() const { return span_hi == 0 ? -1 : (span_hi - 1) / kBk; }
};

// Rows of one query tile together with the key tile they meet.
struct TileGeom {
  int64_t i0, nq;  // first query row and row count
  int64_t j0, nk;  // first key and key count
  const RowRanges* rows;
  // Keys [first, second) of this tile that query row i (tile-local) may see.
  std::pair<int64_t, int64_t> visible(int64_t i) const {
    const int64_t a = std::clamp<int64_t>(rows->lo[i] - j0, 0, nk), n = std::clamp<int64_t>(rows->hi[i] - j0, 0, nk);
    return {a, std::max(a, n)};
  }
};

// Copies rows [0, n) of a [*, D] block into a [kBk, D] buffer; rows past n become zero.
template <typename T>
void load_rows(const T* src, T* dst, int64_t n, int64_t rows, int64_t D) {
  std::copy(src, src + n * D, dst);
  std::fill(dst + n * D, dst + rows * D, T(0));
}

// dst[d * kBk + j] = src[j * D + d], zero for j >= nk: a key (or value) tile transposed so that
// dot products against it become contiguous row updates.
template <typename T>
void load_transposed(const T* src, T* dst, int64_t nk, int64_t D) {
  for (int64_t d = 0; d < D; ++d) {
    T* row = dst + d * kBk;
    for (int64_t j = 0; j < nk; ++j) row[j] = src[j * D + d];
    std::fill(row + nk, row + kBk, T(0));
  }
}

// Explicit 16-byte vectors (SSE2, the x86-64 baseline, so no build flags are needed): each
// lane does exactly the scalar arithmetic, in the same order, so results equal a scalar loop.
using vec::Vec;
using vec::exp_vec;
using vec::exp_shifted;

template <typename T>
T exp_scalar(T x) {
  T v = x;
  exp_shifted(&v, 1, T(0));
  return v;
}

// s[i * kBk + j] = sum_d a[i * D + d] * bt[d * kBk + j], over d in increasing order, for the
// rows and columns covering nq x nk (rounded up to whole blocks; padding inputs are zero).
template <typename T>
void tile_dot(const T* a, const T* bt, T* s, int64_t nq, int64_t nk, int64_t D) {
  using W = Vec<T>;
  constexpr int64_t C = kC<T>, NV = C / W::N;
  const int64_t rows = round_up(nq, kR), cols = round_up(nk, C);
  for (int64_t i = 0; i < rows; i += kR)
    for (int64_t j = 0; j < cols; j += C) {
      typename W::V acc[kR][NV] = {};
      for (int64_t d = 0; d < D; ++d) {
        typename W::V b[NV];
        for (int64_t c = 0; c < NV; ++c) b[c] = W::load(bt + d * kBk + j + c * W::N);
        for (int64_t r = 0; r < kR; ++r) {
          const T x = a[(i + r) * D + d];
          for (int64_t c = 0; c < NV; ++c) acc[r][c] += x * b[c];
        }
      }
      for (int64_t r = 0; r < kR; ++r)
        for (int64_t c = 0; c < NV; ++c) W::store(s + (i + r) * kBk + j + c * W::N, acc[r][c]);
    }
}

// out[o * D + :] += sum_{t < nt} w[o * WO + t * WT] * m[t * D + :], t increasing, for o < no
// (rounded up to a block). Rows of a probability tile (WO = kBk, WT = 1: P V, dS K) or its
// columns (WO = 1, WT = kBk: P^T dO, dS^T Q). `out` is [kBq or kBk, D] scratch.
template <typename T, int64_t WO, int64_t WT>
void tile_acc(const T* w, const T* m, T* out, int64_t no, int64_t nt, int64_t D) {
  using W = Vec<T>;
  constexpr int64_t C = kC<T>, NV = C / W::N;
  const int64_t outs = round_up(no, kR), dfull = D / C * C;
  for (int64_t o = 0; o < outs; o += kR) {
    for (int64_t d0 = 0; d0 < dfull; d0 += C) {
      typename W::V acc[kR][NV];
      for (int64_t r = 0; r < kR; ++r)
        for (int64_t c = 0; c < NV; ++c) acc[r][c] = W::load(out + (o + r) * D + d0 + c * W::N);
      for (int64_t t = 0; t < nt; ++t) {
        typename W::V mv[NV];
        for (int64_t c = 0; c < NV; ++c) mv[c] = W::load(m + t * D + d0 + c * W::N);
        for (int64_t r = 0; r < kR; ++r) {
          const T x = w[(o + r) * WO + t * WT];
          for (int64_t c = 0; c < NV; ++c) acc[r][c] += x * mv[c];
        }
      }
      for (int64_t r = 0; r < kR; ++r)
        for (int64_t c = 0; c < NV; ++c) W::store(out + (o + r) * D + d0 + c * W::N, acc[r][c]);
    }
    for (int64_t r = o; r < o + kR; ++r)  // head dims past the last full block
      for (int64_t t = 0; t < nt; ++t)
        for (int64_t d = dfull; d < D; ++d) out[r * D + d] += w[r * WO + t * WT] * m[t * D + d];
  }
}
// Query rows: out[i] += sum_j w[i, j] m[j]. Key rows: out[j] += sum_i w[i, j] m[i].
template <typename T>
void tile_acc_rows(const T* w, const T* m, T* out, int64_t nq, int64_t nk, int64_t D) {
  tile_acc<T, kBk, 1>(w, m, out, nq, nk, D);
}
template <typename T>
void tile_acc_cols(const T* w, const T* m, T* out, int64_t nq, int64_t nk, int64_t D) {
  tile_acc<T, 1, kBk>(w, m, out, nk, nq, D);
}

// Fills z[i * kBk + j] with the dropout factor (0 or 1/(1-p)) of every visible entry.
template <typename T>
void dropout_factors(const ops::AttentionShape& p, int64_t bh, const TileGeom& g, float* u, T* z) {
  const T keep_scale = T(1) / (T(1) - static_cast<T>(p.dropout_p));
  const int64_t tot = p.total();
  for (int64_t i = 0; i < g.nq; ++i) {
    const auto [a, n] = g.visible(i);
    // Indexed by positions in the whole sequence: a chunk draws the entries the whole call would.
    const uint64_t idx0 = static_cast<uint64_t>((bh * tot + p.q_pos + g.i0 + i) * tot + p.k_pos + g.j0);
    philox_range(p.seed, p.offset, idx0 + static_cast<uint64_t>(a), n - a, u + i * kBk + a);
    for (int64_t j = a; j < n; ++j) z[i * kBk + j] = u[i * kBk + j] >= p.dropout_p ? keep_scale : T(0);
  }
}

template <typename T>
struct FwdScratch {
  std::vector<T> qs, kt, vr, s, z, acc, m, l;
  std::vector<float> u;
  explicit FwdScratch(int64_t D)
      : qs(kBq * D), kt(D * kBk), vr(kBk * D), s(kBq * kBk), z(kBq * kBk), acc(kBq * D), m(kBq), l(kBq),
        u(kBq * kBk) {}
};

template <typename T>
void attention_forward_impl(const ops::AttentionShape& p, const T* q, const T* k, const T* v, T* out, T* lse) {
  check_params(p);
  const int64_t S = p.S, Sk = p.keys(), D = p.D, group = p.Hq / p.Hkv;
  const int64_t nqt = (S + kBq - 1) / kBq;
  const int64_t tasks = p.B * p.Hq * nqt;
  const bool dropout = p.dropout_p > 0.f;
  const T scale = static_cast<T>(p.scale);
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
#pragma omp parallel if (worth_threads(p))
  {
    FwdScratch<T> w(D);
    RowRanges rows;
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      // Reverse tile order within a head: with causal masking the last tiles are the longest,
      // so starting them first balances the dynamic schedule.
      const int64_t bh = task / nqt, qt = nqt - 1 - task % nqt;
      const int64_t b = bh / p.Hq, h = bh % p.Hq;
      const int64_t i0 = qt * kBq, nq = std::min(kBq, S - i0);
      const T* qh = q + bh * S * D;
      const int64_t kvh = (b * p.Hkv + h / group) * Sk * D;
      rows.fill(p, b, i0, nq);
      // The softmax scale is folded into q once per tile; backward does the same, so the
      // recomputed scores match these bit for bit.
      for (int64_t x = 0; x < nq * D; ++x) w.qs[x] = qh[i0 * D + x] * scale;
      std::fill(w.qs.begin() + nq * D, w.qs.end(), T(0));
      std::fill(w.acc.begin(), w.acc.end(), T(0));
      std::fill(w.m.begin(), w.m.end(), kNegInf);
      std::fill(w.l.begin(), w.l.end(), T(0));
      for (int64_t kt = rows.first_tile(); kt <= rows.last_tile(); ++kt) {
        const int64_t j0 = kt * kBk;
        const TileGeom g{i0, nq, j0, std::min(kBk, rows.span_hi - j0), &rows};
        load_transposed(k + kvh + j0 * D, w.kt.data(), g.nk, D);
        load_rows(v + kvh + j0 * D, w.vr.data(), g.nk, kBk, D);
        tile_dot(w.qs.data(), w.kt.data(), w.s.data(), nq, g.nk, D);
        if (dropout) dropout_factors(p, bh, g, w.u.data(), w.z.data());
        for (int64_t i = 0; i < nq; ++i) {
          const auto [a, n] = g.visible(i);
          T* si = w.s.data() + i * kBk;
          std::fill(si, si + a, T(0));  // masked keys carry probability exactly 0
          std::fill(si + n, si + kBk, T(0));
          if (n == a) continue;
          T mx = w.m[i];
          for (int64_t j = a; j < n; ++j) mx = std::max(mx, si[j]);
          const T alpha = exp_scalar(w.m[i] - mx);  // 0 on the first tile (m = -inf)
          exp_shifted(si + a, n - a, mx);
          T sum = 0;
          for (int64_t j = a; j < n; ++j) sum += si[j];
          w.m[i] = mx;
          w.l[i] = w.l[i] * alpha + sum;
          // The normaliser counts every probability; dropout only changes what reaches V.
          if (dropout)
            for (int64_t j = a; j < n; ++j) si[j] *= w.z[i * kBk + j];
          T* ai = w.acc.data() + i * D;
          for (int64_t d = 0; d < D; ++d) ai[d] *= alpha;
        }
        tile_acc_rows(w.s.data(), w.vr.data(), w.acc.data(), nq, g.nk, D);
      }
      for (int64_t i = 0; i < nq; ++i) {
        T* oi = out + (bh * S + i0 + i) * D;
        const T* ai = w.acc.data() + i * D;
        if (w.l[i] > T(0)) {
          const T inv = T(1) / w.l[i];
          for (int64_t d = 0; d < D; ++d) oi[d] = ai[d] * inv;
          lse[bh * S + i0 + i] = w.m[i] + std::log(w.l[i]);
        } else {  // a row that sees no key: zero output, and +inf makes backward's exp() zero
          std::fill(oi, oi + D, T(0));
          lse[bh * S + i0 + i] = std::numeric_limits<T>::infinity();
        }
      }
    }
  }
}

// ---- backward

template <typename T>
struct BwdScratch {
  std::vector<T> qs, dout, lse, di, kt, vt, kr, s, dp, z, dq, dk, dv;
  std::vector<float> u;
  RowRanges rows;
  BwdScratch(int64_t D, int64_t kv_rows)
      : qs(kBq * D),
        dout(kBq * D),
        lse(kBq),
        di(kBq),
        kt(D * kBk),
        vt(D * kBk),
        kr(kBk * D),
        s(kBq * kBk),
        dp(kBq * kBk),
        z(kBq * kBk),
        dq(kBq * D),
        dk(kv_rows * D),
        dv(kv_rows * D),
        u(kBq * kBk) {}
};

// Loads the per-query-tile state: scaled q, dO, lse and D_i = rowsum(dO * O), the term that
// makes softmax backward a single pass: dS = P * (dP - D_i), since sum_j P_ij dP_ij = dO_i . O_i
// (also with dropout, where O already carries the dropped, rescaled probabilities).
template <typename T>
void load_query_tile(const ops::AttentionShape& p, int64_t bh, int64_t i0, int64_t nq, const T* q, const T* out,
                     const T* lse, const T* dout, BwdScratch<T>& w) {
  const int64_t S = p.S, D = p.D;
  const T scale = static_cast<T>(p.scale);
  const T* qh = q + (bh * S + i0) * D;
  const T* oh = out + (bh * S + i0) * D;
  const T* gh = dout + (bh * S + i0) * D;
  for (int64_t x = 0; x < nq * D; ++x) w.qs[x] = qh[x] * scale;
  std::fill(w.qs.begin() + nq * D, w.qs.end(), T(0));
  load_rows(gh, w.dout.data(), nq, kBq, D);
  for (int64_t i = 0; i < nq; ++i) {
    T acc = 0;
    for (int64_t d = 0; d < D; ++d) acc += gh[i * D + d] * oh[i * D + d];
    w.di[i] = acc;
    w.lse[i] = lse[bh * S + i0 + i];
  }
  w.rows.fill(p, bh / p.Hq, i0, nq);
}

// One (query tile, key tile) pair: recomputes P from lse and accumulates into w.dq (unscaled)
// and/or dk, dv ([kBk, D] scratch rows of this key tile). dk uses the scaled q, which carries
// the softmax scale; dq is scaled once at the end by the caller.
template <typename T>
void tile_backward(const ops::AttentionShape& p, int64_t bh, const TileGeom& g, const T* kh, const T* vh,
                   BwdScratch<T>& w, bool want_dq, T* dk, T* dv) {
  const int64_t D = p.D;
  const bool dropout = p.dropout_p > 0.f;
  load_transposed(kh + g.j0 * D, w.kt.data(), g.nk, D);
  load_transposed(vh + g.j0 * D, w.vt.data(), g.nk, D);
  tile_dot(w.qs.data(), w.kt.data(), w.s.data(), g.nq, g.nk, D);
  tile_dot(w.dout.data(), w.vt.data(), w.dp.data(), g.nq, g.nk, D);
  if (dropout) dropout_factors(p, bh, g, w.u.data(), w.z.data());
  for (int64_t i = 0; i < g.nq; ++i) {
    const auto [a, n] = g.visible(i);
    T* si = w.s.data() + i * kBk;
    T* dpi = w.dp.data() + i * kBk;
    const T l = w.lse[i], di = w.di[i];
    exp_shifted(si + a, n - a, l);
    if (dropout) {
      const T* zi = w.z.data() + i * kBk;
      // dp becomes dS; s becomes the dropped probabilities that multiplied V in forward.
      for (int64_t j = a; j < n; ++j) {
        dpi[j] = si[j] * (dpi[j] * zi[j] - di);
        si[j] *= zi[j];
      }
    } else {
      for (int64_t j = a; j < n; ++j) dpi[j] = si[j] * (dpi[j] - di);
    }
    std::fill(si, si + a, T(0));
    std::fill(dpi, dpi + a, T(0));
    std::fill(si + n, si + kBk, T(0));
    std::fill(dpi + n, dpi + kBk, T(0));
  }
  if (dv) tile_acc_cols(w.s.data(), w.dout.data(), dv, g.nq, g.nk, D);
  if (dk) tile_acc_cols(w.dp.data(), w.qs.data(), dk, g.nq, g.nk, D);
  if (want_dq) {
    load_rows(kh + g.j0 * D, w.kr.data(), g.nk, kBk, D);
    tile_acc_rows(w.dp.data(), w.kr.data(), w.dq.data(), g.nq, g.nk, D);
  }
}

template <typename T>
void store_dq(const ops::AttentionShape& p, int64_t bh, int64_t i0, int64_t nq, const BwdScratch<T>& w, T* dq) {
  const T scale = static_cast<T>(p.scale);
  T* dst = dq + (bh * p.S + i0) * p.D;
  for (int64_t x = 0; x < nq * p.D; ++x) dst[x] = w.dq[x] * scale;
}

template <typename T>
void attention_backward_impl(const ops::AttentionShape& p, const T* q, const T* k, const T* v, const T* out,
                             const T* lse, const T* dout, T* dq, T* dk, T* dv) {
  check_params(p);
  const int64_t S = p.S, Sk = p.keys(), D = p.D, group = p.Hq / p.Hkv;
  const int64_t nt = (S + kBq - 1) / kBq, nkt = (Sk + kBk - 1) / kBk;
  const int64_t kv_heads = p.B * p.Hkv;
  // The key tiles each (sample, query tile) meets: [first, last] per entry, computed once, so
  // both schedules skip exactly the same empty pairs.
  std::vector<std::pair<int64_t, int64_t>> spans(static_cast<size_t>(p.B * nt));
  {
    RowRanges r;
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t qt = 0; qt < nt; ++qt) {
        r.fill(p, b, qt * kBq, std::min(kBq, S - qt * kBq));
        spans[static_cast<size_t>(b * nt + qt)] = {r.first_tile(), r.last_tile()};
      }
  }
  auto span = [&](int64_t b, int64_t qt) { return spans[static_cast<size_t>(b * nt + qt)]; };
  auto geom = [&](const BwdScratch<T>& w, int64_t qt, int64_t kt) {
    return TileGeom{qt * kBq, std::min(kBq, S - qt * kBq), kt * kBk, std::min(kBk, Sk - kt * kBk), &w.rows};
  };
  // The schedule choice only changes who computes what, never the arithmetic order.
  const bool fused = kv_heads >= 2 * static_cast<int64_t>(omp_get_max_threads());
  // Key rows with no query seeing them get zero gradients.
  std::fill(dk, dk + kv_heads * Sk * D, T(0));
  std::fill(dv, dv + kv_heads * Sk * D, T(0));

  if (fused) {
#pragma omp parallel if (worth_threads(p))
    {
      BwdScratch<T> w(D, nkt * kBk);
#pragma omp for schedule(dynamic, 1)
      for (int64_t bkv = 0; bkv < kv_heads; ++bkv) {
        const int64_t b = bkv / p.Hkv, hk = bkv % p.Hkv;
        const T* kh = k + bkv * Sk * D;
        const T* vh = v + bkv * Sk * D;
        std::fill(w.dk.begin(), w.dk.end(), T(0));
        std::fill(w.dv.begin(), w.dv.end(), T(0));
        for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
          const int64_t bh = b * p.Hq + h;
          for (int64_t qt = 0; qt < nt; ++qt) {
            const TileGeom g0 = geom(w, qt, 0);
            load_query_tile(p, bh, g0.i0, g0.nq, q, out, lse, dout, w);
            std::fill(w.dq.begin(), w.dq.end(), T(0));
            const auto [k0, k1] = span(b, qt);
            for (int64_t kt = k0; kt <= k1; ++kt)
              tile_backward(p, bh, geom(w, qt, kt), kh, vh, w, true, w.dk.data() + kt * kBk * D,
                            w.dv.data() + kt * kBk * D);
            store_dq(p, bh, g0.i0, g0.nq, w, dq);
          }
        }
        std::copy(w.dk.begin(), w.dk.begin() + Sk * D, dk + bkv * Sk * D);
        std::copy(w.dv.begin(), w.dv.begin() + Sk * D, dv + bkv * Sk * D);
      }
    }
    return;
  }

#pragma omp parallel if (worth_threads(p))
  {
    BwdScratch<T> w(D, kBk);
    // dk, dv: one task per key tile of a kv head, visiting query heads and tiles in the same
    // order as the fused schedule. The two loops write disjoint outputs: no barrier between.
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t task = 0; task < kv_heads * nkt; ++task) {
      const int64_t bkv = task / nkt, kt = task % nkt;
      const int64_t b = bkv / p.Hkv, hk = bkv % p.Hkv;
      const T* kh = k + bkv * Sk * D;
      const T* vh = v + bkv * Sk * D;
      std::fill(w.dk.begin(), w.dk.end(), T(0));
      std::fill(w.dv.begin(), w.dv.end(), T(0));
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        const int64_t bh = b * p.Hq + h;
        for (int64_t qt = 0; qt < nt; ++qt) {
          const auto [k0, k1] = span(b, qt);
          if (kt < k0 || kt > k1) continue;
          const TileGeom g = geom(w, qt, kt);
          load_query_tile(p, bh, g.i0, g.nq, q, out, lse, dout, w);
          tile_backward(p, bh, g, kh, vh, w, false, w.dk.data(), w.dv.data());
        }
      }
      const int64_t j0 = kt * kBk, nk = std::min(kBk, Sk - j0);
      std::copy(w.dk.begin(), w.dk.begin() + nk * D, dk + (bkv * Sk + j0) * D);
      std::copy(w.dv.begin(), w.dv.begin() + nk * D, dv + (bkv * Sk + j0) * D);
    }
    // dq: one task per query tile of a query head, longest (last) tiles first.
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < p.B * p.Hq * nt; ++task) {
      const int64_t bh = task / nt, qt = nt - 1 - task % nt;
      const int64_t b = bh / p.Hq, h = bh % p.Hq;
      const int64_t bkv = b * p.Hkv + h / group;
      const TileGeom g0 = geom(w, qt, 0);
      load_query_tile(p, bh, g0.i0, g0.nq, q, out, lse, dout, w);
      std::fill(w.dq.begin(), w.dq.end(), T(0));
      const auto [k0, k1] = span(b, qt);
      for (int64_t kt = k0; kt <= k1; ++kt)
        tile_backward<T>(p, bh, geom(w, qt, kt), k + bkv * Sk * D, v + bkv * Sk * D, w, true, nullptr, nullptr);
      store_dq(p, bh, g0.i0, g0.nq, w, dq);
    }
  }
}

}  // namespace

void attention_forward(const ops::AttentionShape& p, const float* q, const float* k, const float* v, float* out,
                       float* lse) {
  attention_forward_impl(p, q, k, v, out, lse);
}
void attention_forward(const ops::AttentionShape& p, const double* q, const double* k, const double* v, double* out,
                       double* lse) {
  attention_forward_impl(p, q, k, v, out, lse);
}
void attention_backward(const ops::AttentionShape& p, const float* q, const float* k, const float* v, const float* out,
                        const float* lse, const float* dout, float* dq, float* dk, float* dv) {
  attention_backward_impl(p, q, k, v, out, lse, dout, dq, dk, dv);
}
void attention_backward(const ops::AttentionShape& p, const double* q, const double* k, const double* v,
                        const double* out, const double* lse, const double* dout, double* dq, double* dk, double* dv) {
  attention_backward_impl(p, q, k, v, out, lse, dout, dq, dk, dv);
}

}  // namespace mt::cpu
