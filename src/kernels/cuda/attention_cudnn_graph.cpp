// The cuDNN fused flash attention graphs (cuDNN 9 backend API), their cache and execution.
//
// Why composite graphs and not CUDNN_BACKEND_OPERATION_SDPA_FWD/BWD_DESCRIPTOR: those single
// nodes (cuDNN >= 9.13) carry no causal mask attribute (only block masks and paging) and are
// what the frontend uses for Blackwell/inference; on Hopper, causal GQA training runs through
// the runtime-fusion engines, which recognise the pattern below (the one cudnn-frontend's
// composite SDPA nodes emit for cuDNN 9 before the unified softmax op of 9.21).
//
// Forward (s = b,hq,sq,skv scores, r = b,hq,sq,1 row vectors; fp32 unless noted):
//   S = matmul(Q, Kᵀ)            Kᵀ is K's memory seen as [b,hkv,d,s] (strides swapped);
//                                GQA is the matmul's head broadcast hkv -> hq
//   S = S * scale                by-value scalar
//   [causal] r_i = gen_index(S, axis 2), c_i = gen_index(S, axis 3) (int32);
//            keep = r_i >= c_i (bool); S = select(S, -inf, keep)
//   M = max_reduce(S) ; E = exp(S - M) ; Z = sum_reduce(E)
//   Stats = M + log(Z)           -> lse output [b,hq,s,1]
//   P = E / Z ; O = matmul(P, V) -> bf16 output
// Backward:
//   softmax_sum = sum_reduce(dO * O) * 1      fp32 [b,hq,s,1], non-virtual (workspace; a
//                                             virtual one in the fallback variant, see build())
//   S as above through the mask, P = exp(S - Stats)
//   dV = matmul(reshape(P -> Pᵀ, bf16), dO)   [GQA: to b,hq,s,d then sum_reduce over the group]
//   dP = matmul(dO, Vᵀ) ; dS = (dP - softmax_sum) * P * scale
//   dK = matmul(reshape(dS -> dSᵀ, bf16), Q)  [GQA: as dV]
//   dQ = matmul(dS, reshape(Kᵀ -> K))
//   Non-deterministic variant: dQ goes through an fp32 dQ_accum workspace tensor (atomics),
//   then identity -> dQ. Its absence is how the backend is asked for the deterministic
//   ("dP workspace") algorithm; that is what the frontend's set_deterministic_algorithm does
//   on Hopper. Engine configs whose numerical notes say NONDETERMINISTIC are skipped as well.
// Packed documents (the ragged graph, Dims::ragged): b = documents, s = the longest; every
// matmul gets the per-document lengths as its M/N/K extents (GEMM_*_OVERRIDE), the scores get a
// padding mask (row < seq_q && col < seq_kv, selected before the causal mask, and once more
// after the stats in the backward), and Q, K, V, O, dO, dQ, dK, dV and Stats carry ragged
// offset tensors (CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC, element offsets, [b+1,1,1,1]): into our
// own [B,h,S,d] memory, whose heads stride over whole samples (VarlenLayout::Heads, no copy),
// or into token-major copies (Tokens: the packed THD layout of cuDNN's docs). Never a padded
// layout. softmax_sum and dQ_accum are workspace tensors over the padded [b,h,s,*] extents.
// Layout: Q, K, V, dQ, dK, dV and Stats are always [b,h,s,d] contiguous; O and dO either too
// (AttnLayout::Heads) or Megatron's sequence-first rows (AttnLayout::Rows): the same dims with
// strides {h*d, d, b*h*d, 1}, so the core writes and reads linear_proj's input in place.
#ifdef MT_HAVE_CUDNN

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>

#include "core/error.h"
#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/cudnn_backend.h"
#include "kernels/cuda/scratch.h"

namespace mt::cuda {

namespace {

using cudnn::Desc;

// Non-virtual tensors of the variant pack.
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kScale,
  kMaskVal,
  kOne,
  kDO,
  kDQ,
  kDK,
  kDV,
  kSoftmaxSum,
  kDQAccum,
  // Packed documents (ragged): per-document lengths and element offsets (see Dims::ragged).
  kSeqQ,
  kSeqKV,
  kQOff,
  kKOff,
  kStatsOff,
  kPadVal,
  kFirstVirtual = 100,
};

std::string shape_str(const ops::AttentionShape& p, AttnLayout layout) {
  return fmt::format("B={} Hq={} Hkv={} S={} D={} causal={} scale={} O layout={}", p.B, p.Hq, p.Hkv, p.S, p.D,
                     p.causal ? 1 : 0, p.scale, layout == AttnLayout::Rows ? "rows" : "heads");
}

int64_t round_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

// ---- graph construction
struct Tensor {
  const Desc* d = nullptr;
};

class GraphBuilder {
 public:
  explicit GraphBuilder(std::deque<Desc>& keep) : keep_(keep) {}

  Tensor tensor(int64_t uid, cudnnDataType_t dt, const std::vector<int64_t>& dims, const std::vector<int64_t>& strides,
                bool is_virtual, bool by_value = false, const Tensor* ragged_offset = nullptr) {
    Desc& t = add(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    t.set_i64(CUDNN_ATTR_TENSOR_UNIQUE_ID, uid)
        .set_dtype(CUDNN_ATTR_TENSOR_DATA_TYPE, dt)
        .set_i64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 16)
        .set_i64s(CUDNN_ATTR_TENSOR_DIMENSIONS, dims)
        .set_i64s(CUDNN_ATTR_TENSOR_STRIDES, strides)
        .set_bool(CUDNN_ATTR_TENSOR_IS_VIRTUAL, is_virtual);
    if (by_value) t.set_bool(CUDNN_ATTR_TENSOR_IS_BY_VALUE, true);
    if (ragged_offset && ragged_offset->d) t.set_desc(CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC, *ragged_offset->d);
    t.finalize(fmt::format("tensor uid {}", uid).c_str());
    return {&t};
  }
  Tensor virt(cudnnDataType_t dt, const std::vector<int64_t>& dims, const std::vector<int64_t>& strides) {
    return tensor(next_uid_++, dt, dims, strides, true);
  }
  int64_t next_uid() { return next_uid_++; }
  Tensor scalar(int64_t uid) { return tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true); }
  // An int32 device vector [n, 1, 1, 1] (document lengths, ragged offsets).
  Tensor ints(int64_t uid, int64_t n) { return tensor(uid, CUDNN_DATA_INT32, {n, 1, 1, 1}, {1, 1, 1, 1}, false); }

  // y = mode(x[, b[, t]]); axis for GEN_INDEX.
  void pointwise(const char* name, cudnnPointwiseMode_t mode, cudnnDataType_t prec, Tensor x, const Tensor* b,
                 const Tensor* t, Tensor y, int64_t axis = -1) {
    Desc& pw = add(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode)
        .set_dtype(CUDNN_ATTR_POINTWISE_MATH_PREC, prec);
    if (axis >= 0) pw.set_i64(CUDNN_ATTR_POINTWISE_AXIS, axis);
    pw.finalize(name);
    Desc& op = add(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw).set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, *x.d);
    if (b) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b->d);
    if (t) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *t->d);
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, *y.d);
    finish(op, name);
  }
  void reduction(const char* name, cudnnReduceTensorOp_t red, Tensor x, Tensor y) {
    Desc& rd = add(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    rd.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &red)
        .set_dtype(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_DATA_FLOAT);
    rd.finalize(name);
    Desc& op = add(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, *x.d)
        .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, *y.d)
        .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd);
    finish(op, name);
  }
  // C = A B; m/n/k (optional): per-batch GEMM extents (the document lengths of a ragged graph).
  void matmul(const char* name, Tensor a, Tensor b, Tensor c, const Tensor* m = nullptr, const Tensor* n = nullptr,
              const Tensor* k = nullptr) {
    Desc& mm = add(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    mm.set_dtype(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_DATA_FLOAT);
    mm.finalize(name);
    Desc& op = add(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, *a.d)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, *b.d)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, *c.d)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
    if (m && m->d) op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, *m->d);
    if (n && n->d) op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, *n->d);
    if (k && k->d) op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, *k->d);
    finish(op, name);
  }
  void reshape(const char* name, Tensor x, Tensor y) {
    Desc& op = add(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, *x.d).set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, *y.d);
    finish(op, name);
  }

  const std::vector<cudnnBackendDescriptor_t>& ops() const { return ops_; }
  const std::string& op_names() const { return names_; }

 private:
  Desc& add(cudnnBackendDescriptorType_t type) { return keep_.emplace_back(type); }
  void finish(Desc& op, const char* name) {
    op.finalize(name);
    ops_.push_back(op.get());
    names_ += names_.empty() ? name : std::string(", ") + name;
  }

  std::deque<Desc>& keep_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  std::string names_;
  int64_t next_uid_ = kFirstVirtual;
};

struct Dims {
  int64_t b, h, hk, s, d;
  bool o_rows = false;  // O and dO in the sequence-first rows (AttnLayout::Rows)
  // Packed documents: b counts documents (a bucket, unused ones of length 0) and s is the
  // longest one (a bucket); each document's first element comes from a ragged offset tensor.
  // Heads: Q, K, V, O, their gradients and Stats stay in our [B, h, len, d] memory (heads step
  // over whole samples of `len` tokens), no copy. Tokens: token-major copies [B*len, h, d]
  // (Stats [B*len, h]), the packed THD layout of cuDNN's docs.
  VarlenLayout ragged = VarlenLayout::None;
  int64_t len = 0;
  // [b, heads, s, d] strides of a graph input or output with `heads` heads.
  std::vector<int64_t> io_str(int64_t heads) const {
    switch (ragged) {
      case VarlenLayout::Heads: return {heads * len * d, len * d, d, 1};
      case VarlenLayout::Tokens: return {s * heads * d, d, heads * d, 1};
      default: return {heads * s * d, s * d, d, 1};
    }
  }
  std::vector<int64_t> bhsd() const { return {b, h, s, d}; }
  std::vector<int64_t> bhsd_str() const { return io_str(h); }
  std::vector<int64_t> dense_str() const { return {h * s * d, s * d, d, 1}; }  // workspace / virtual
  // O and dO [b, h, s, d]. Rows: [s*b, h*d] in (s, b) order, O[i,j,t,e] at ((t*b + i)*h + j)*d + e.
  std::vector<int64_t> o_str() const { return o_rows ? std::vector<int64_t>{h * d, d, b * h * d, 1} : bhsd_str(); }
  std::vector<int64_t> kv() const { return {b, hk, s, d}; }
  std::vector<int64_t> kv_str() const { return io_str(hk); }
  // K or V memory seen transposed: [b, hk, d, s].
  std::vector<int64_t> kvT() const { return {b, hk, d, s}; }
  std::vector<int64_t> kvT_str() const {
    const std::vector<int64_t> t = io_str(hk);
    return {t[0], t[1], t[3], t[2]};
  }
  std::vector<int64_t> ss() const { return {b, h, s, s}; }
  std::vector<int64_t> ss_str() const { return {h * s * s, s * s, s, 1}; }
  std::vector<int64_t> ssT_str() const { return {h * s * s, s * s, 1, s}; }
  std::vector<int64_t> row() const { return {b, h, s, 1}; }
  std::vector<int64_t> row_str() const {  // Stats
    switch (ragged) {
      case VarlenLayout::Heads: return {h * len, len, 1, 1};
      case VarlenLayout::Tokens: return {s * h, 1, h, 1};
      default: return {h * s, s, 1, 1};
    }
  }
  std::vector<int64_t> dense_row_str() const { return {h * s, s, 1, 1}; }
};

// The ragged graph's extra inputs (empty tensors for a plain graph): document lengths (the
// matmuls' per-batch extents and the padding mask) and ragged offsets in elements.
struct Varlen {
  Tensor seq_q, seq_kv, q_off, k_off, stats_off, pad_val;
  bool on() const { return seq_q.d != nullptr; }
};

Varlen varlen_inputs(GraphBuilder& g, const Dims& n) {
  if (n.ragged == VarlenLayout::None) return {};
  return {g.ints(kSeqQ, n.b),       g.ints(kSeqKV, n.b),         g.ints(kQOff, n.b + 1),
          g.ints(kKOff, n.b + 1),   g.ints(kStatsOff, n.b + 1), g.scalar(kPadVal)};
}

// S = select(S, pad value, row < seq_q && col < seq_kv): the padding mask of a ragged graph,
// as the fusion engines expect it (before the causal mask).
Tensor padding_mask(GraphBuilder& g, const Dims& n, Tensor s, const Varlen& vl, const char* tag) {
  const Tensor row = g.virt(CUDNN_DATA_INT32, n.ss(), n.ss_str()), col = g.virt(CUDNN_DATA_INT32, n.ss(), n.ss_str());
  g.pointwise(tag, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, s, nullptr, nullptr, row, 2);
  g.pointwise(tag, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, s, nullptr, nullptr, col, 3);
  const Tensor rk = g.virt(CUDNN_DATA_BOOLEAN, n.ss(), n.ss_str()), ck = g.virt(CUDNN_DATA_BOOLEAN, n.ss(), n.ss_str());
  g.pointwise(tag, CUDNN_POINTWISE_CMP_LT, CUDNN_DATA_BOOLEAN, row, &vl.seq_q, nullptr, rk);
  g.pointwise(tag, CUDNN_POINTWISE_CMP_LT, CUDNN_DATA_BOOLEAN, col, &vl.seq_kv, nullptr, ck);
  const Tensor keep = g.virt(CUDNN_DATA_BOOLEAN, n.ss(), n.ss_str());
  g.pointwise(tag, CUDNN_POINTWISE_LOGICAL_AND, CUDNN_DATA_BOOLEAN, rk, &ck, nullptr, keep);
  const Tensor out = g.virt(CUDNN_DATA_FLOAT, n.ss(), n.ss_str());
  g.pointwise(tag, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, s, &vl.pad_val, &keep, out);
  return out;
}

// S = select(S, mask value, row >= col): the causal mask as the fusion engines expect it.
Tensor causal_mask(GraphBuilder& g, const Dims& n, Tensor s, Tensor mask_val) {
  const Tensor row = g.virt(CUDNN_DATA_INT32, n.ss(), n.ss_str()), col = g.virt(CUDNN_DATA_INT32, n.ss(), n.ss_str());
  g.pointwise("gen_row_index", CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, s, nullptr, nullptr, row, 2);
  g.pointwise("gen_col_index", CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, s, nullptr, nullptr, col, 3);
  const Tensor keep = g.virt(CUDNN_DATA_BOOLEAN, n.ss(), n.ss_str());
  g.pointwise("row_ge_col", CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, &col, nullptr, keep);
  const Tensor out = g.virt(CUDNN_DATA_FLOAT, n.ss(), n.ss_str());
  g.pointwise("causal_select", CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, s, &mask_val, &keep, out);
  return out;
}

// scale * Q Kᵀ, padding-masked (ragged) and causally masked: shared by both directions.
Tensor scores(GraphBuilder& g, const Dims& n, bool causal, Tensor q, Tensor kT, Tensor scale, Tensor mask_val,
              const Varlen& vl) {
  const Tensor s0 = g.virt(CUDNN_DATA_FLOAT, n.ss(), n.ss_str()), s1 = g.virt(CUDNN_DATA_FLOAT, n.ss(), n.ss_str());
  g.matmul("matmul_Q_KT", q, kT, s0, vl.on() ? &vl.seq_q : nullptr, vl.on() ? &vl.seq_kv : nullptr);
  g.pointwise("mul_scale", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, s0, &scale, nullptr, s1);
  const Tensor s2 = vl.on() ? padding_mask(g, n, s1, vl, "padding_mask") : s1;
  return causal ? causal_mask(g, n, s2, mask_val) : s2;
}

void build_forward(GraphBuilder& g, const Dims& n, bool causal, cudnnDataType_t p_type) {
  const Varlen vl = varlen_inputs(g, n);
  const Tensor q = g.tensor(kQ, CUDNN_DATA_BFLOAT16, n.bhsd(), n.bhsd_str(), false, false, &vl.q_off);
  const Tensor kT = g.tensor(kK, CUDNN_DATA_BFLOAT16, n.kvT(), n.kvT_str(), false, false, &vl.k_off);
  const Tensor v = g.tensor(kV, CUDNN_DATA_BFLOAT16, n.kv(), n.kv_str(), false, false, &vl.k_off);
  const Tensor o = g.tensor(kO, CUDNN_DATA_BFLOAT16, n.bhsd(), n.o_str(), false, false, &vl.q_off);
  const Tensor stats = g.tensor(kStats, CUDNN_DATA_FLOAT, n.row(), n.row_str(), false, false, &vl.stats_off);
  const Tensor scale = g.scalar(kScale);
  const Tensor mask_val = causal ? g.scalar(kMaskVal) : Tensor{};
  const Tensor s = scores(g, n, causal, q, kT, scale, mask_val, vl);
  auto full = [&] { return g.virt(CUDNN_DATA_FLOAT, n.ss(), n.ss_str()); };
  auto rows = [&] { return g.virt(CUDNN_DATA_FLOAT, n.row(), n.row_str()); };
  const Tensor m = rows(), z = full(), e = full(), sum = rows(), lg = rows();
  const Tensor p = g.virt(p_type, n.ss(), n.ss_str());
  g.reduction("max", CUDNN_REDUCE_TENSOR_MAX, s, m);
  g.pointwise("sub_max", CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, s, &m, nullptr, z);
  g.pointwise("exp", CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, z, nullptr, nullptr, e);
  g.reduction("sum", CUDNN_REDUCE_TENSOR_ADD, e, sum);
  g.pointwise("log", CUDNN_POINTWISE_LOG, CUDNN_DATA_FLOAT, sum, nullptr, nullptr, lg);
  g.pointwise("stats", CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, m, &lg, nullptr, stats);
  g.pointwise("div_sum", CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, e, &sum, nullptr, p);
  g.matmul("matmul_P_V", p, v, o, vl.on() ? &vl.seq_q : nullptr, nullptr, vl.on() ? &vl.seq_kv : nullptr);
}

// dX = matmul(a, b) written to `out` [b, hk, s, d]; with GQA through a per-query-head [b, hq,
// s, d] virtual product summed over each group.
// Ragged: m = the key lengths, k = the query lengths.
void grad_kv(GraphBuilder& g, const Dims& n, const char* name, Tensor a, Tensor b, Tensor out, const Varlen& vl) {
  const Tensor* m = vl.on() ? &vl.seq_kv : nullptr;
  const Tensor* k = vl.on() ? &vl.seq_q : nullptr;
  if (n.h == n.hk) {
    g.matmul(name, a, b, out, m, nullptr, k);
    return;
  }
  const Tensor full = g.virt(CUDNN_DATA_BFLOAT16, n.bhsd(), n.dense_str());
  g.matmul(name, a, b, full, m, nullptr, k);
  g.reduction("sum_group_heads", CUDNN_REDUCE_TENSOR_ADD, full, out);
}

void build_backward(GraphBuilder& g, const Dims& n, bool causal, bool deterministic, bool sum_in_workspace) {
  const Varlen vl = varlen_inputs(g, n);
  const Tensor* qo = &vl.q_off;
  const Tensor* ko = &vl.k_off;
  const Tensor q = g.tensor(kQ, CUDNN_DATA_BFLOAT16, n.bhsd(), n.bhsd_str(), false, false, qo);
  const Tensor kT = g.tensor(kK, CUDNN_DATA_BFLOAT16, n.kvT(), n.kvT_str(), false, false, ko);
  const Tensor vT = g.tensor(kV, CUDNN_DATA_BFLOAT16, n.kvT(), n.kvT_str(), false, false, ko);
  const Tensor o = g.tensor(kO, CUDNN_DATA_BFLOAT16, n.bhsd(), n.o_str(), false, false, qo);
  const Tensor dO = g.tensor(kDO, CUDNN_DATA_BFLOAT16, n.bhsd(), n.o_str(), false, false, qo);
  const Tensor stats = g.tensor(kStats, CUDNN_DATA_FLOAT, n.row(), n.row_str(), false, false, &vl.stats_off);
  const Tensor dQ = g.tensor(kDQ, CUDNN_DATA_BFLOAT16, n.bhsd(), n.bhsd_str(), false, false, qo);
  const Tensor dK = g.tensor(kDK, CUDNN_DATA_BFLOAT16, n.kv(), n.kv_str(), false, false, ko);
  const Tensor dV = g.tensor(kDV, CUDNN_DATA_BFLOAT16, n.kv(), n.kv_str(), false, false, ko);
  const Tensor scale = g.scalar(kScale), one = g.scalar(kOne);
  const Tensor mask_val = causal ? g.scalar(kMaskVal) : Tensor{};
  auto full = [&] { return g.virt(CUDNN_DATA_FLOAT, n.ss(), n.ss_str()); };

  // softmax_sum = rowsum(dO * O): the delta term of dS = P * (dP - delta). The product takes
  // dO's strides, as the frontend infers them.
  const Tensor dOO = g.virt(CUDNN_DATA_FLOAT, n.bhsd(), n.o_str());
  const Tensor rsum = g.virt(CUDNN_DATA_FLOAT, n.row(), n.dense_row_str());
  const Tensor softmax_sum = sum_in_workspace
                                 ? g.tensor(kSoftmaxSum, CUDNN_DATA_FLOAT, n.row(), n.dense_row_str(), false)
                                 : g.virt(CUDNN_DATA_FLOAT, n.row(), n.dense_row_str());
  g.pointwise("mul_dO_O", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dO, &o, nullptr, dOO);
  g.reduction("sum_dO_O", CUDNN_REDUCE_TENSOR_ADD, dOO, rsum);
  g.pointwise("softmax_sum", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, rsum, &one, nullptr, softmax_sum);

  // P = exp(S - lse); dV = Pᵀ dO.
  const Tensor s = scores(g, n, causal, q, kT, scale, mask_val, vl);
  const Tensor z = full(), p = full();
  g.pointwise("sub_stats", CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, s, &stats, nullptr, z);
  // Ragged: the padding mask again after the stats are subtracted (cudnn-frontend does the same
  // for cuDNN 9, where the padded rows' stats would otherwise leak into P).
  const Tensor zm = vl.on() ? padding_mask(g, n, z, vl, "padding_mask_2") : z;
  g.pointwise("exp_s", CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, zm, nullptr, nullptr, p);
  const Tensor pT = g.virt(CUDNN_DATA_BFLOAT16, n.ss(), n.ssT_str());
  g.reshape("reshape_P_T", p, pT);
  grad_kv(g, n, "matmul_PT_dO", pT, dO, dV, vl);

  // dS = P * (dO Vᵀ - softmax_sum) * scale; dK = dSᵀ Q; dQ = dS K.
  const Tensor dP = full(), dS0 = full(), dS1 = full(), dS = full();
  g.matmul("matmul_dO_VT", dO, vT, dP, vl.on() ? &vl.seq_q : nullptr, vl.on() ? &vl.seq_kv : nullptr);
  g.pointwise("sub_softmax_sum", CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, dP, &softmax_sum, nullptr, dS0);
  g.pointwise("mul_P", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dS0, &p, nullptr, dS1);
  g.pointwise("mul_dS_scale", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dS1, &scale, nullptr, dS);
  const Tensor dST = g.virt(CUDNN_DATA_BFLOAT16, n.ss(), n.ssT_str());
  g.reshape("reshape_dS_T", dS, dST);
  grad_kv(g, n, "matmul_dST_Q", dST, q, dK, vl);
  // K seen untransposed: a virtual tensor that keeps K's ragged offsets.
  const Tensor k = g.tensor(g.next_uid(), CUDNN_DATA_BFLOAT16, n.kv(), n.kv_str(), true, false, ko);
  g.reshape("reshape_KT_K", kT, k);
  const Tensor* mq = vl.on() ? &vl.seq_q : nullptr;
  const Tensor* kk = vl.on() ? &vl.seq_kv : nullptr;
  if (deterministic) {
    g.matmul("matmul_dS_K", dS, k, dQ, mq, nullptr, kk);
  } else {
    const Tensor acc = g.tensor(kDQAccum, CUDNN_DATA_FLOAT, n.bhsd(), n.dense_str(), false);
    g.matmul("matmul_dS_K", dS, k, acc, mq, nullptr, kk);
    g.pointwise("identity_dQ", CUDNN_POINTWISE_IDENTITY, CUDNN_DATA_FLOAT, acc, nullptr, nullptr, dQ);
  }
}

// ---- plans and their cache
struct Key {
  int device;
  int64_t B, Hq, Hkv, S, D;
  uint32_t scale_bits;
  bool causal, backward, deterministic;
  AttnLayout layout;  // O/dO strides differ, and so may the engine and plan
  VarlenLayout ragged;  // packed documents: which memory the ragged graph reads (Dims::ragged)
  int64_t ragged_len;   // and the sample length its strides step over
  auto tie() const {
    return std::tie(device, B, Hq, Hkv, S, D, scale_bits, causal, backward, deterministic, layout, ragged, ragged_len);
  }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

struct Plan {
  std::deque<Desc> keep;  // tensors, operations, graph: alive as long as the plan
  Desc plan;
  int64_t engine_ws = 0;  // the engine's own workspace
  int64_t softmax_sum_off = 0, dq_accum_off = 0, dq_accum_bytes = 0, total_ws = 0;
  bool sum_in_workspace = false;  // backward: softmax_sum is a workspace tensor (variant 0)
  std::string error;              // non-empty: this shape cannot run on cuDNN
};

long version() { return static_cast<long>(cudnnGetVersion()); }

bool has_note(cudnnBackendDescriptor_t engine, cudnnBackendNumericalNote_t want) {
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  int64_t n = 0;
  if (cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, notes) != CUDNN_STATUS_SUCCESS)
    return false;
  for (int64_t i = 0; i < n; ++i)
    if (notes[i] == want) return true;
  return false;
}

// MT_CUDNN_ENGINE_SKIP=k (a benchmarking knob): pass over the first k configs that finalize, and
// name each finalized config on stderr, to time the alternatives to the heuristics' first choice.
int engine_skip() {
  static const int k = [] {
    const char* v = std::getenv("MT_CUDNN_ENGINE_SKIP");
    return v ? std::atoi(v) : -1;
  }();
  return k;
}

// Heuristics (mode A, then the fallback list); the first config whose plan finalizes wins.
// Throws mt::Error listing every config tried and cuDNN's reason for each.
void choose_engine(cudnnHandle_t h, const Desc& graph, bool need_deterministic, Plan& out) {
  std::string tried;
  int finalized = 0;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    const char* mode_name = mode == CUDNN_HEUR_MODE_A ? "A" : "FALLBACK";
    Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph)
        .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    if (const cudnnStatus_t st = heur.try_finalize(); st != CUDNN_STATUS_SUCCESS) {
      tried += fmt::format(" [heuristics {}: {}]", mode_name, cudnn::describe(st));
      continue;
    }
    int64_t count = 0;
    cudnn::check(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                          &count, nullptr),
                 "engine heuristics result count");
    if (count == 0) {
      tried += fmt::format(" [heuristics {}: no engine configs]", mode_name);
      continue;
    }
    std::vector<Desc> cfgs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; i < count; ++i) raw.push_back(cfgs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR).get());
    int64_t got = 0;
    cudnn::check(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                          count, &got, raw.data()),
                 "engine heuristics results");
    for (int64_t i = 0; i < got; ++i) {
      Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
      cudnnBackendDescriptor_t eraw = engine.get();
      int64_t n = 0, index = -1;
      if (cudnnBackendGetAttribute(raw[i], CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &eraw) ==
          CUDNN_STATUS_SUCCESS)
        cudnnBackendGetAttribute(eraw, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &index);
      if (need_deterministic && has_note(eraw, CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC)) {
        tried += fmt::format(" [{} #{} engine {}: skipped, nondeterministic]", mode_name, i, index);
        continue;
      }
      Desc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      plan.set_handle(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, h).set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfgs[i]);
      if (const cudnnStatus_t st = plan.try_finalize(); st != CUDNN_STATUS_SUCCESS) {
        tried += fmt::format(" [{} #{} engine {}: {}]", mode_name, i, index, cudnn::describe(st));
        continue;
      }
      int64_t ws = 0;
      cudnn::check(
          cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws),
          "plan workspace size");
      if (engine_skip() >= 0) {
        const bool skip = finalized++ < engine_skip();
        std::fprintf(stderr, "cuDNN attention: heuristics %s #%lld engine %lld finalizes (workspace %lld)%s\n", mode_name,
                     static_cast<long long>(i), static_cast<long long>(index), static_cast<long long>(ws),
                     skip ? ", skipped (MT_CUDNN_ENGINE_SKIP)" : ", chosen");
        if (skip) continue;
      }
      out.plan = std::move(plan);
      out.engine_ws = ws;
      for (Desc& c : cfgs) out.keep.push_back(std::move(c));
      return;
    }
  }
  fail("no cuDNN engine config could be finalized:{}", tried);
}


// The largest workspace one attention backward may take: MT_CUDNN_ATTN_WORKSPACE_LIMIT (bytes)
// when set, else a quarter of the device's memory (19.8 GiB on an H100: S = 16k with 32 heads
// stays on cuDNN, 32k goes to the flash kernels).
int64_t attention_workspace_limit(int device) {
  if (const char* env = std::getenv("MT_CUDNN_ATTN_WORKSPACE_LIMIT"); env && *env) {
    char* end = nullptr;
    const long long v = std::strtoll(env, &end, 10);
    if (end == env || *end != '\0' || v <= 0)
      fail("MT_CUDNN_ATTN_WORKSPACE_LIMIT='{}' is not a positive number of bytes", env);
    return static_cast<int64_t>(v);
  }
  cudaDeviceProp prop{};
  MT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return static_cast<int64_t>(prop.totalGlobalMem / 4);
}

class Registry {
 public:
  static Registry& get() {
    static Registry r;
    return r;
  }
  std::mutex mu;

  cudnnHandle_t handle(int device) {
    auto it = handles_.find(device);
    if (it != handles_.end()) return it->second;
    cudnnHandle_t h = nullptr;
    cudnn::check(cudnnCreate(&h), "cudnnCreate");
    // One handle per device for the process; never destroyed (cuDNN tears down with the context).
    return handles_[device] = h;
  }

  // ragged != None: p is the ragged graph's view (B documents, S the longest; see Dims::ragged)
  // of samples of ragged_len tokens.
  Plan& plan(const ops::AttentionShape& p, bool backward, bool deterministic, AttnLayout layout,
             VarlenLayout ragged = VarlenLayout::None, int64_t ragged_len = 0) {
    int device = 0;
    MT_CUDA_CHECK(cudaGetDevice(&device));
    uint32_t bits = 0;
    std::memcpy(&bits, &p.scale, sizeof bits);
    const Key key{device,   p.B,      p.Hq,     p.Hkv,  p.S, p.D, bits, p.causal, backward, backward && deterministic,
                  layout, ragged, ragged_len};
    auto it = plans_.find(key);
    if (it != plans_.end()) return *it->second;
    auto pl = std::make_unique<Plan>();
    build(*pl, p, device, backward, key.deterministic, layout, ragged, ragged_len);
    return *(plans_[key] = std::move(pl));
  }

 private:
  void build(Plan& pl, const ops::AttentionShape& p, int device, bool backward, bool deterministic, AttnLayout layout,
             VarlenLayout ragged, int64_t ragged_len) {
    std::string why;
    if (!cudnn_attention_supported(p, &why)) {
      pl.error = why;
      return;
    }
    const Dims n{p.B, p.Hq, p.Hkv, p.S, p.D, layout == AttnLayout::Rows, ragged, ragged_len};
    // Variant 0 is the graph current cudnn-frontend emits. Variant 1 is its older form (forward:
    // P rounded to bf16 before the PV matmul; backward: softmax_sum virtual), tried when the first
    // is rejected, so that one GPU run covers both and the error lists the reasons for each.
    std::string errors;
    for (int variant = 0; variant < 2; ++variant) {
      pl.keep.clear();
      GraphBuilder g(pl.keep);
      try {
        const cudnnHandle_t h = handle(device);
        if (backward)
          build_backward(g, n, p.causal, deterministic, variant == 0);
        else
          build_forward(g, n, p.causal, variant == 0 ? CUDNN_DATA_FLOAT : CUDNN_DATA_BFLOAT16);
        Desc& graph = pl.keep.emplace_back(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
        graph.set_handle(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, h)
            .set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(g.ops().size()),
                 g.ops().data());
        graph.finalize("operation graph");
        choose_engine(h, graph, backward && deterministic, pl);
        pl.sum_in_workspace = backward && variant == 0;
        errors.clear();
        break;
      } catch (const Error& e) {
        errors += fmt::format(" [graph variant {}: {} Ops: {}]", variant, e.what(), g.op_names());
      }
    }
    if (!errors.empty()) {
      pl.error = fmt::format("cuDNN {}{}{} graph for {} (cuDNN {}) cannot be built:{}",
                             ragged == VarlenLayout::None ? "" : fmt::format("ragged ({}) ", varlen_layout_name(ragged)),
                             backward ? "backward" : "forward", (deterministic || !backward) ? "" : " (nondeterministic)",
                             shape_str(p, layout), version(), errors);
      return;
    }
    // Workspace: the engine's, then the graph's own non-virtual intermediates (256-aligned).
    int64_t off = round_up(pl.engine_ws, 256);
    if (pl.sum_in_workspace) {
      pl.softmax_sum_off = off;
      off += round_up(p.B * p.Hq * p.S * int64_t{4}, 256);
    }
    if (backward && !deterministic) {
      pl.dq_accum_off = off;
      pl.dq_accum_bytes = p.B * p.Hq * p.S * p.D * int64_t{4};
      off += round_up(pl.dq_accum_bytes, 256);
    }
    pl.total_ws = off;
    // cuDNN's deterministic backward ("dP workspace" algorithm) asks for B*Hq*S*S*2 bytes: 64 GiB
    // at S = 32k with 32 heads, more than the card holds beside the model. Above a limit that
    // depends only on the shape and the device (never on free memory, so every run of a config
    // picks the same kernels and keeps its bits), the plan is refused: `auto` runs our flash
    // kernels, which need no S x S buffer, and `fused` says so by name. A ragged graph asks the
    // same over its buckets (documents x Hq x longest² x 2 bytes, whatever the real lengths), so
    // packed documents keep the deterministic cuDNN backward only while their buckets fit.
    if (backward && deterministic) {
      const int64_t limit = attention_workspace_limit(device);
      if (pl.total_ws > limit)
        pl.error = fmt::format(
            "the deterministic cuDNN backward for {} needs {:.1f} GiB of workspace (about B*Hq*S*S*2 bytes{}), above "
            "the {:.1f} GiB limit (a quarter of the device's memory, or MT_CUDNN_ATTN_WORKSPACE_LIMIT bytes); use "
            "--attention-backend flash or auto, or --nondeterministic-attention",
            shape_str(p, layout), static_cast<double>(pl.total_ws) / (1 << 30),
            ragged == VarlenLayout::None ? "" : ", B and S the document buckets",
            static_cast<double>(limit) / (1 << 30));
    }
  }

  std::map<int, cudnnHandle_t> handles_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

void execute(const Plan& pl, cudnnHandle_t h, std::vector<int64_t> uids, std::vector<void*> ptrs, void* ws,
             cudaStream_t s, const char* what) {
  Desc vp(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  vp.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()), uids.data())
      .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, static_cast<int64_t>(ptrs.size()), ptrs.data())
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
  vp.finalize("variant pack");
  cudnn::check(cudnnSetStream(h, s), "cudnnSetStream");
  cudnn::check(cudnnBackendExecute(h, pl.plan.get(), vp.get()), what);
}

// The value masked scores take: cuDNN < 9.10 wants the lowest finite float (as the frontend).
float mask_value() {
  return version() < 91000 ? std::numeric_limits<float>::lowest() : -std::numeric_limits<float>::infinity();
}

}  // namespace

bool cudnn_attention_compiled() { return true; }
long cudnn_runtime_version() { return version(); }

bool cudnn_attention_supported(const ops::AttentionShape& p, std::string* why) {
  auto no = [&](std::string r) {
    if (why) *why = std::move(r);
    return false;
  };
  const long ver = version();
  if (ver < 90000) return no(fmt::format("cuDNN {} is loaded; the fused attention graphs here need cuDNN 9", ver));
  if (p.dropout_p > 0.f)
    return no("attention dropout is not supported by the cuDNN path (our kernels apply the CPU-matching Philox mask)");
  if (p.D % 8 != 0 || p.D > 128) return no(fmt::format("head dim {} (cuDNN needs a multiple of 8, at most 128)", p.D));
  if (p.Hkv <= 0 || p.Hq % p.Hkv != 0) return no(fmt::format("Hq {} is not a multiple of Hkv {}", p.Hq, p.Hkv));
  // cudnn-frontend works around a cuDNN <= 9.15 backward problem with S % 128 != 0 by adding a
  // padding mask with per-batch lengths; that variant is not built here.
  if (p.S % 128 != 0 && ver <= 91500)
    return no(fmt::format("S={} is not a multiple of 128, which cuDNN {} (<= 9.15) handles only with a padding mask",
                          p.S, ver));
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    cudaGetLastError();
    return no("no CUDA device");
  }
  if (major < 8) return no(fmt::format("compute capability {}.x (cuDNN fused attention needs 8.0+)", major));
  return true;
}

std::string cudnn_attention_prepare(const ops::AttentionShape& p, bool backward, bool deterministic,
                                    AttnLayout layout) {
  Registry& r = Registry::get();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.plan(p, backward, deterministic, layout).error;
}

namespace {

// The ragged graph's device inputs for one call: document lengths and offsets (attention_varlen.cu
// derives them from the device cu_seqlens, in stream order), in a scratch block.
struct VarlenArgs {
  Scratch buf;
  VarlenArgs(const ops::AttentionShape& p, const VarlenBuckets& vb, VarlenLayout layout, cudaStream_t s)
      : buf(static_cast<size_t>(varlen_descriptor_ints(vb.docs)) * sizeof(int32_t), s) {
    varlen_descriptors(p, vb.docs, layout, buf.as<int32_t>(), s);
  }
  void add(std::vector<int64_t>& uids, std::vector<void*>& ptrs, int64_t docs, float* pad) {
    int32_t* b = buf.as<int32_t>();
    // Layout of varlen_descriptors: lengths [docs], q, k and stats offsets [docs + 1] each.
    for (auto [uid, ptr] : {std::pair<int64_t, void*>{kSeqQ, b}, {kSeqKV, b}, {kQOff, b + docs},
                            {kKOff, b + 2 * docs + 1}, {kStatsOff, b + 3 * docs + 2}, {kPadVal, pad}})
      uids.push_back(uid), ptrs.push_back(ptr);
  }
};

// The value padded scores take (cudnn-frontend's choice for the padding mask).
float pad_value() { return std::numeric_limits<float>::lowest(); }

// One forward or backward launch on an already built plan; `ragged` adds the documents' inputs.
void run_forward(Registry& r, const Plan& pl, const ops::AttentionShape& p, const bf16* q, const bf16* k,
                 const bf16* v, bf16* out, float* lse, cudaStream_t s, VarlenArgs* ragged, int64_t docs) {
  int device = 0;
  MT_CUDA_CHECK(cudaGetDevice(&device));
  float scale = p.scale, mask = mask_value(), pad = pad_value();
  Scratch ws(static_cast<size_t>(pl.total_ws), s);
  std::vector<int64_t> uids{kQ, kK, kV, kO, kStats, kScale};
  std::vector<void*> ptrs{const_cast<bf16*>(q), const_cast<bf16*>(k), const_cast<bf16*>(v), out, lse, &scale};
  if (p.causal) uids.push_back(kMaskVal), ptrs.push_back(&mask);
  if (ragged) ragged->add(uids, ptrs, docs, &pad);
  execute(pl, r.handle(device), std::move(uids), std::move(ptrs), ws.as<char>(), s, "attention forward execute");
}

void run_backward(Registry& r, const Plan& pl, const ops::AttentionShape& p, const bf16* q, const bf16* k,
                  const bf16* v, const bf16* out, const float* lse, const bf16* dout, bf16* dq, bf16* dk, bf16* dv,
                  cudaStream_t s, VarlenArgs* ragged, int64_t docs) {
  int device = 0;
  MT_CUDA_CHECK(cudaGetDevice(&device));
  float scale = p.scale, one = 1.f, mask = mask_value(), pad = pad_value();
  Scratch ws(static_cast<size_t>(pl.total_ws), s);
  std::vector<int64_t> uids{kQ, kK, kV, kO, kDO, kStats, kDQ, kDK, kDV, kScale, kOne};
  std::vector<void*> ptrs{const_cast<bf16*>(q),
                          const_cast<bf16*>(k),
                          const_cast<bf16*>(v),
                          const_cast<bf16*>(out),
                          const_cast<bf16*>(dout),
                          const_cast<float*>(lse),
                          dq,
                          dk,
                          dv,
                          &scale,
                          &one};
  if (pl.sum_in_workspace) uids.push_back(kSoftmaxSum), ptrs.push_back(ws.as<char>() + pl.softmax_sum_off);
  if (p.causal) uids.push_back(kMaskVal), ptrs.push_back(&mask);
  if (pl.dq_accum_bytes > 0) {
    // cuDNN < 9.6 expects the accumulator zeroed by the caller (as the frontend does).
    if (version() < 90600)
      MT_CUDA_CHECK(cudaMemsetAsync(ws.as<char>() + pl.dq_accum_off, 0, static_cast<size_t>(pl.dq_accum_bytes), s));
    uids.push_back(kDQAccum), ptrs.push_back(ws.as<char>() + pl.dq_accum_off);
  }
  if (ragged) ragged->add(uids, ptrs, docs, &pad);
  execute(pl, r.handle(device), std::move(uids), std::move(ptrs), ws.as<char>(), s, "attention backward execute");
}

}  // namespace

void cudnn_attention_forward(const ops::AttentionShape& p, const bf16* q, const bf16* k, const bf16* v, bf16* out,
                             float* lse, cudaStream_t s, AttnLayout layout) {
  Registry& r = Registry::get();
  std::lock_guard<std::mutex> lock(r.mu);
  const Plan& pl = r.plan(p, false, true, layout);
  if (!pl.error.empty()) fail("cuDNN attention forward unavailable: {}", pl.error);
  run_forward(r, pl, p, q, k, v, out, lse, s, nullptr, 0);
}

void cudnn_attention_backward(const ops::AttentionShape& p, const bf16* q, const bf16* k, const bf16* v,
                              const bf16* out, const float* lse, const bf16* dout, bf16* dq, bf16* dk, bf16* dv,
                              cudaStream_t s, bool deterministic, AttnLayout layout) {
  Registry& r = Registry::get();
  std::lock_guard<std::mutex> lock(r.mu);
  const Plan& pl = r.plan(p, true, deterministic, layout);
  if (!pl.error.empty()) fail("cuDNN attention backward unavailable: {}", pl.error);
  run_backward(r, pl, p, q, k, v, out, lse, dout, dq, dk, dv, s, nullptr, 0);
}

namespace {

// The ragged plan of one call and direction: the forced layout (set_varlen_layout), else Heads
// where it builds, else Tokens. Null with `err` set when none builds. Caller holds r.mu.
Plan* varlen_plan(Registry& r, const ops::AttentionShape& p, bool backward, bool deterministic, VarlenLayout* chosen,
                  std::string* err) {
  std::string why;
  if (!cudnn_varlen_supported(p, &why)) {
    *err = why;
    return nullptr;
  }
  const ops::AttentionShape c = varlen_view(p, varlen_buckets(p));
  const VarlenLayout forced = varlen_layout();
  err->clear();
  for (VarlenLayout l : {VarlenLayout::Heads, VarlenLayout::Tokens}) {
    if (forced != VarlenLayout::None && l != forced) continue;
    Plan& pl = r.plan(c, backward, deterministic, AttnLayout::Heads, l, p.S);
    if (pl.error.empty()) {
      if (chosen) *chosen = l;
      return &pl;
    }
    *err += (err->empty() ? "" : " / ") + pl.error;
  }
  return nullptr;
}

// One packed-document call: the registry lock, the chosen layout's plan, the ragged inputs, and
// (Tokens) the token-major copies of its tensors in stream-ordered scratch.
class VarlenCall {
 public:
  VarlenCall(const ops::AttentionShape& p, bool backward, bool deterministic, cudaStream_t s)
      : p_(p),
        s_(s),
        lock_(r_.mu),
        pl_(find(backward, deterministic)),
        vb_(varlen_buckets(p)),
        view_(varlen_view(p, vb_)),
        args_(p, vb_, layout_, s) {}
  bool tokens() const { return layout_ == VarlenLayout::Tokens; }
  // Heads: x itself. Tokens: a token-major copy of x (bf16 [B,H,S,D], or fp32 lse [B,H,S]),
  // filled from x when it is an input.
  template <typename T>
  T* in(const T* x, int64_t heads, bool input = true) {
    if (!tokens()) return const_cast<T*>(x);
    T* t = copies_.emplace_back(static_cast<size_t>(p_.B * heads * p_.S * row<T>()), s_).template as<T>();
    if (input) varlen_transpose(x, t, p_.B, heads, p_.S, row<T>(), true, s_);
    return t;
  }
  // Tokens: the result `t` back into our layout at x.
  template <typename T>
  void out(const T* t, T* x, int64_t heads) {
    if (tokens()) varlen_transpose(t, x, p_.B, heads, p_.S, row<T>(), false, s_);
  }
  Registry& r() { return r_; }
  const Plan& plan() const { return *pl_; }
  const ops::AttentionShape& view() const { return view_; }
  VarlenArgs* args() { return &args_; }
  int64_t docs() const { return vb_.docs; }

 private:
  template <typename T>
  int64_t row() const {
    return std::is_same_v<T, float> ? 4 : p_.D * static_cast<int64_t>(sizeof(T));
  }
  const Plan* find(bool backward, bool deterministic) {
    std::string err;
    const Plan* pl = varlen_plan(r_, p_, backward, deterministic, &layout_, &err);
    if (!pl) fail("cuDNN packed-document attention {} unavailable: {}", backward ? "backward" : "forward", err);
    return pl;
  }
  const ops::AttentionShape& p_;
  cudaStream_t s_;
  Registry& r_ = Registry::get();
  std::lock_guard<std::mutex> lock_;
  VarlenLayout layout_ = VarlenLayout::None;
  const Plan* pl_;
  VarlenBuckets vb_;
  ops::AttentionShape view_;
  VarlenArgs args_;
  std::deque<Scratch> copies_;
};

}  // namespace

std::string cudnn_attention_varlen_prepare(const ops::AttentionShape& p, bool backward, bool deterministic,
                                           VarlenLayout* chosen) {
  Registry& r = Registry::get();
  std::lock_guard<std::mutex> lock(r.mu);
  std::string err;
  varlen_plan(r, p, backward, deterministic, chosen, &err);
  return err;
}

void cudnn_attention_varlen_forward(const ops::AttentionShape& p, const bf16* q, const bf16* k, const bf16* v,
                                    bf16* out, float* lse, cudaStream_t s) {
  VarlenCall c(p, false, true, s);
  bf16* o = c.in<bf16>(out, p.Hq, false);
  float* l = c.in<float>(lse, p.Hq, false);
  run_forward(c.r(), c.plan(), c.view(), c.in(q, p.Hq), c.in(k, p.Hkv), c.in(v, p.Hkv), o, l, s, c.args(), c.docs());
  c.out(o, out, p.Hq);
  c.out(l, lse, p.Hq);
}

void cudnn_attention_varlen_backward(const ops::AttentionShape& p, const bf16* q, const bf16* k, const bf16* v,
                                     const bf16* out, const float* lse, const bf16* dout, bf16* dq, bf16* dk, bf16* dv,
                                     cudaStream_t s, bool deterministic) {
  VarlenCall c(p, true, deterministic, s);
  bf16 *gq = c.in<bf16>(dq, p.Hq, false), *gk = c.in<bf16>(dk, p.Hkv, false), *gv = c.in<bf16>(dv, p.Hkv, false);
  run_backward(c.r(), c.plan(), c.view(), c.in(q, p.Hq), c.in(k, p.Hkv), c.in(v, p.Hkv), c.in(out, p.Hq),
               c.in(lse, p.Hq), c.in(dout, p.Hq), gq, gk, gv, s, c.args(), c.docs());
  c.out(gq, dq, p.Hq);
  c.out(gk, dk, p.Hkv);
  c.out(gv, dv, p.Hkv);
}

}  // namespace mt::cuda

#endif  // MT_HAVE_CUDNN
