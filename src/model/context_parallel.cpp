#include "model/context_parallel.h"

#include <utility>

#include "core/error.h"

namespace mt::model {

std::vector<int64_t> cp_chunks(int64_t n, int64_t r) { return {r, 2 * n - 1 - r}; }

std::vector<int32_t> cp_positions(int64_t S, int64_t n, int64_t r) {
  const int64_t L = S / (2 * n);
  std::vector<int32_t> pos;
  pos.reserve(static_cast<size_t>(2 * L));
  for (int64_t c : cp_chunks(n, r))
    for (int64_t i = 0; i < L; ++i) pos.push_back(static_cast<int32_t>(c * L + i));
  return pos;
}

namespace {

// ---- Sequence rows of [B, H, S, D] tensors (any device: flat copies and the add op).
Tensor seq_rows(const Tensor& x, int64_t s0, int64_t n) {
  const int64_t BH = x.dim(0) * x.dim(1), S = x.dim(2), D = x.dim(3);
  Tensor y = Tensor::empty({x.dim(0), x.dim(1), n, D}, x.dtype(), x.device());
  for (int64_t h = 0; h < BH; ++h) y.flat_range(h * n * D, {n * D}).copy_from(x.flat_range((h * S + s0) * D, {n * D}));
  return y;
}
// Chunks of L rows laid end to end along the sequence.
Tensor concat_rows(const std::vector<Tensor>& parts) {
  const Tensor& f = parts.front();
  const int64_t BH = f.dim(0) * f.dim(1), L = f.dim(2), D = f.dim(3), n = static_cast<int64_t>(parts.size());
  Tensor y = Tensor::empty({f.dim(0), f.dim(1), n * L, D}, f.dtype(), f.device());
  for (int64_t c = 0; c < n; ++c)
    for (int64_t h = 0; h < BH; ++h)
      y.flat_range((h * n + c) * L * D, {L * D}).copy_from(parts[static_cast<size_t>(c)].flat_range(h * L * D, {L * D}));
  return y;
}
void add_rows(Tensor& y, const Tensor& x, int64_t s0) {
  const int64_t BH = y.dim(0) * y.dim(1), S = y.dim(2), n = x.dim(2), D = y.dim(3);
  for (int64_t h = 0; h < BH; ++h) {
    Tensor dst = y.flat_range((h * S + s0) * D, {n * D});
    ops::add_inplace(dst, x.flat_range(h * n * D, {n * D}));
  }
}
std::vector<Tensor> split_rows(const Tensor& x, int64_t L) {
  std::vector<Tensor> out;
  for (int64_t s0 = 0; s0 < x.dim(2); s0 += L) out.push_back(seq_rows(x, s0, L));
  return out;
}
Tensor zeros_like(const Tensor& x) { return Tensor::zeros(x.shape(), x.dtype(), x.device()); }

comm::DataType comm_type(const Tensor& t) {
  switch (t.dtype()) {
    case DType::F32: return comm::DataType::F32;
    case DType::BF16: return comm::DataType::BF16;
    case DType::F16: return comm::DataType::F16;
    default: break;
  }
  MT_CHECK(false, "context parallelism: no collective for {} tensors", dtype_name(t.dtype()));
  return comm::DataType::F32;
}

// ---- Ulysses all-to-all over a group of a: [B, H, S, D] (this rank's rows, all heads) <->
// [B, H/a, a*S, D] (every member's rows in member order, this rank's H/a heads).
Tensor seq_to_heads(const Tensor& x, comm::Communicator& g) {
  const int64_t a = g.size(), B = x.dim(0), H = x.dim(1), S = x.dim(2), D = x.dim(3), h = H / a;
  const int64_t run = h * S * D, blk = B * run;
  Tensor in = Tensor::empty({a * blk}, x.dtype(), x.device()), out = Tensor::empty({a * blk}, x.dtype(), x.device());
  for (int64_t m = 0; m < a; ++m)
    for (int64_t b = 0; b < B; ++b) in.flat_range(m * blk + b * run, {run}).copy_from(x.flat_range((b * H + m * h) * S * D, {run}));
  g.all_to_all(in.raw(), out.raw(), static_cast<size_t>(blk), comm_type(x));
  Tensor y = Tensor::empty({B, h, a * S, D}, x.dtype(), x.device());
  for (int64_t m = 0; m < a; ++m)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < h; ++j)
        y.flat_range(((b * h + j) * a + m) * S * D, {S * D}).copy_from(out.flat_range(m * blk + (b * h + j) * S * D, {S * D}));
  return y;
}
Tensor heads_to_seq(const Tensor& y, comm::Communicator& g) {
  const int64_t a = g.size(), B = y.dim(0), h = y.dim(1), S = y.dim(2) / a, D = y.dim(3), H = h * a;
  const int64_t run = h * S * D, blk = B * run;
  Tensor in = Tensor::empty({a * blk}, y.dtype(), y.device()), out = Tensor::empty({a * blk}, y.dtype(), y.device());
  for (int64_t m = 0; m < a; ++m)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < h; ++j)
        in.flat_range(m * blk + (b * h + j) * S * D, {S * D}).copy_from(y.flat_range(((b * h + j) * a + m) * S * D, {S * D}));
  g.all_to_all(in.raw(), out.raw(), static_cast<size_t>(blk), comm_type(y));
  Tensor x = Tensor::empty({B, H, S, D}, y.dtype(), y.device());
  for (int64_t m = 0; m < a; ++m)
    for (int64_t b = 0; b < B; ++b) x.flat_range((b * H + m * h) * S * D, {run}).copy_from(out.flat_range(m * blk + b * run, {run}));
  return x;
}
Tensor lse_to_heads(const Tensor& lse, comm::Communicator& g) {
  Tensor y = seq_to_heads(lse.view({lse.dim(0), lse.dim(1), lse.dim(2), 1}), g);
  return y.view({y.dim(0), y.dim(1), y.dim(2)});
}
Tensor lse_to_seq(const Tensor& lse, comm::Communicator& g) {
  Tensor x = heads_to_seq(lse.view({lse.dim(0), lse.dim(1), lse.dim(2), 1}), g);
  return x.view({x.dim(0), x.dim(1), x.dim(2)});
}

// ---- The chunk-pair engine: queries in chunks of L rows, key/value blocks of several chunks.
struct Block {
  Tensor k, v;
  std::vector<int64_t> chunks;
};

struct Chunked {
  ops::AttentionShape base;  // B, heads, D, scale, causal, dropout, documents; seq_total set
  int64_t L = 0;
  std::vector<int64_t> q_ids;  // this rank's query chunks, in storage order
  ops::AttentionShape pair(int64_t qc, int64_t kc) const {
    ops::AttentionShape p = base;
    p.S = p.Sk = L;
    p.q_pos = qc * L;
    p.k_pos = kc * L;
    return p;
  }
  // Causal: a query chunk meets the key chunks at or before it only.
  bool meets(int64_t qc, int64_t kc) const { return !base.causal || kc <= qc; }

  // outs/lses (per query chunk; undefined until a first block meets it) merged with `b`.
  void forward(const std::vector<Tensor>& qs, const Block& b, std::vector<Tensor>& outs, std::vector<Tensor>& lses) const {
    const std::vector<Tensor> ks = split_rows(b.k, L), vs = split_rows(b.v, L);
    for (size_t i = 0; i < qs.size(); ++i)
      for (size_t j = 0; j < b.chunks.size(); ++j) {
        if (!meets(q_ids[i], b.chunks[j])) continue;
        Tensor o, l;
        ops::attention_forward(pair(q_ids[i], b.chunks[j]), qs[i], ks[j], vs[j], o, l);
        if (!outs[i].defined()) {
          outs[i] = std::move(o);
          lses[i] = std::move(l);
        } else {
          ops::attention_merge(outs[i], lses[i], o, l);
        }
      }
  }
  // dq (per query chunk) += and dk, dv (the block's) += the gradients of the pairs `b` meets.
  void backward(const std::vector<Tensor>& qs, const std::vector<Tensor>& outs, const std::vector<Tensor>& lses,
                const std::vector<Tensor>& douts, const Block& b, std::vector<Tensor>& dqs, Tensor& dk,
                Tensor& dv) const {
    const std::vector<Tensor> ks = split_rows(b.k, L), vs = split_rows(b.v, L);
    for (size_t i = 0; i < qs.size(); ++i)
      for (size_t j = 0; j < b.chunks.size(); ++j) {
        if (!meets(q_ids[i], b.chunks[j])) continue;
        Tensor gq, gk, gv;
        ops::attention_backward(pair(q_ids[i], b.chunks[j]), qs[i], ks[j], vs[j], outs[i], lses[i], douts[i], gq, gk,
                                gv);
        ops::add_inplace(dqs[i], gq);
        add_rows(dk, gk, static_cast<int64_t>(j) * L);
        add_rows(dv, gv, static_cast<int64_t>(j) * L);
      }
  }
};

// One ring step's transfer: `send` to the next member, `recv` (same shapes) from the previous.
struct RingExchange {
  std::vector<comm::WorkHandle> works;
  void start(comm::Communicator& ring, const std::vector<Tensor>& send, std::vector<Tensor>& recv) {
    const int p = ring.size(), j = ring.rank();
    for (size_t i = 0; i < send.size(); ++i) {
      recv.push_back(Tensor::empty(send[i].shape(), send[i].dtype(), send[i].device()));
      works.push_back(ring.send_async(send[i].raw(), static_cast<size_t>(send[i].numel()), comm_type(send[i]), (j + 1) % p));
      works.push_back(ring.recv_async(recv.back().raw(), static_cast<size_t>(send[i].numel()), comm_type(send[i]),
                                      (j + p - 1) % p));
    }
  }
  void wait() {
    for (auto& w : works) w->wait();
    works.clear();
  }
};

// The layout of a2a+p2p (and its two extremes): CP rank c = inner + a * outer; an all-to-all
// group holds the CP ranks of one `outer`, the ring the ranks of one `inner`.
struct Hierarchy {
  int64_t cp = 1, a = 1, p = 1;
  comm::Communicator* a2a = nullptr;   // null when a == 1
  comm::Communicator* ring = nullptr;  // null when p == 1
  // The chunks ring member t holds after the all-to-all: its group's chunks in member order.
  std::vector<int64_t> chunks(int64_t t) const {
    std::vector<int64_t> ids;
    for (int64_t m = 0; m < a; ++m)
      for (int64_t c : cp_chunks(cp, m + a * t)) ids.push_back(c);
    return ids;
  }
  int64_t ring_rank() const { return ring ? ring->rank() : 0; }
};

Hierarchy hierarchy(const ContextParallel& cp) {
  Hierarchy h;
  h.cp = cp.size();
  if (cp.comm_type == "p2p") {
    h.ring = cp.group;
  } else if (cp.comm_type == "a2a") {
    h.a2a = cp.group;
  } else {
    MT_CHECK(cp.comm_type == "a2a+p2p" && cp.a2a && cp.ring, "context parallelism: comm type '{}' without its groups",
             cp.comm_type);
    h.a2a = cp.a2a->size() > 1 ? cp.a2a : nullptr;
    h.ring = cp.ring->size() > 1 ? cp.ring : nullptr;
  }
  h.a = h.a2a ? h.a2a->size() : 1;
  h.p = h.ring ? h.ring->size() : 1;
  MT_CHECK(h.a * h.p == h.cp, "context parallelism: all-to-all {} x ring {} is not the CP size {}", h.a, h.p, h.cp);
  return h;
}

}  // namespace

void prepare_cp_transfers(const ContextParallel& cp) {
  if (!cp.on() || cp.comm_type == "a2a" || cp.comm_type == "allgather") return;
  const Hierarchy h = hierarchy(cp);
  if (!h.ring) return;
  const int p = h.ring->size(), j = h.ring->rank();
  std::vector<int> peers{(j + 1) % p};
  if ((j + p - 1) % p != peers[0]) peers.push_back((j + p - 1) % p);
  h.ring->prepare_p2p(peers);
}

namespace {

Chunked engine(const ops::AttentionShape& p, int64_t cp, std::vector<int64_t> q_ids, int64_t heads_div) {
  Chunked c;
  c.base = p;
  c.base.seq_total = p.total();
  c.base.Hq = p.Hq / heads_div;
  c.base.Hkv = p.Hkv / heads_div;
  c.L = p.total() / (2 * cp);
  MT_CHECK(c.L * 2 * cp == p.total() && p.S * cp == p.total(),
           "context parallelism: {} local tokens of a sequence of {} over CP {}", p.S, p.total(), cp);
  c.q_ids = std::move(q_ids);
  return c;
}

// lse [B, H, S] as a [B, H, S, 1] tensor, for the row helpers above.
Tensor as_rows(const Tensor& lse) { return lse.view({lse.dim(0), lse.dim(1), lse.dim(2), 1}); }
Tensor from_rows(const Tensor& x) { return x.view({x.dim(0), x.dim(1), x.dim(2)}); }
std::vector<Tensor> split_lse(const Tensor& lse, int64_t L) {
  std::vector<Tensor> out;
  for (const Tensor& t : split_rows(as_rows(lse), L)) out.push_back(from_rows(t));
  return out;
}
Tensor concat_lse(const std::vector<Tensor>& lses) {
  std::vector<Tensor> r;
  for (const Tensor& l : lses) r.push_back(as_rows(l));
  return from_rows(concat_rows(r));
}

// ---- allgather: every rank's keys and values at once; dK, dV reduce-scattered back.
struct Gathered {
  Tensor k, v;  // [n * numel]: member m's block at m * numel
  int64_t count = 0;
  Block block(int64_t m, int64_t n, const Shape& shape) const {
    return Block{k.flat_range(m * count, shape), v.flat_range(m * count, shape), cp_chunks(n, m)};
  }
};
Gathered gather_kv(comm::Communicator& g, const Tensor& k, const Tensor& v) {
  const int64_t n = g.size();
  Gathered a{Tensor::empty({n * k.numel()}, k.dtype(), k.device()), Tensor::empty({n * v.numel()}, v.dtype(), v.device()),
             k.numel()};
  g.all_gather(k.raw(), a.k.raw(), static_cast<size_t>(a.count), comm_type(k));
  g.all_gather(v.raw(), a.v.raw(), static_cast<size_t>(a.count), comm_type(v));
  return a;
}

void allgather_forward(const ContextParallel& cp, const ops::AttentionShape& p, const Tensor& q, const Tensor& k,
                       const Tensor& v, Tensor& out, Tensor& lse) {
  const int64_t n = cp.size();
  const Chunked c = engine(p, n, cp_chunks(n, cp.rank()), 1);
  const std::vector<Tensor> qs = split_rows(q, c.L);
  std::vector<Tensor> outs(qs.size()), lses(qs.size());
  const Gathered a = gather_kv(*cp.group, k, v);
  for (int64_t m = 0; m < n; ++m) c.forward(qs, a.block(m, n, k.shape()), outs, lses);
  out = concat_rows(outs);
  lse = concat_lse(lses);
}

void allgather_backward(const ContextParallel& cp, const ops::AttentionShape& p, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dq,
                        Tensor& dk, Tensor& dv) {
  const int64_t n = cp.size();
  const Chunked c = engine(p, n, cp_chunks(n, cp.rank()), 1);
  const std::vector<Tensor> qs = split_rows(q, c.L), outs = split_rows(out, c.L), douts = split_rows(dout, c.L),
                            lses = split_lse(lse, c.L);
  std::vector<Tensor> dqs;
  for (const Tensor& x : qs) dqs.push_back(zeros_like(x));
  const Gathered a = gather_kv(*cp.group, k, v);
  Tensor dka = Tensor::zeros({n * a.count}, k.dtype(), k.device()), dva = Tensor::zeros({n * a.count}, v.dtype(), v.device());
  for (int64_t m = 0; m < n; ++m) {
    Tensor gk = dka.flat_range(m * a.count, k.shape()), gv = dva.flat_range(m * a.count, v.shape());
    c.backward(qs, outs, lses, douts, a.block(m, n, k.shape()), dqs, gk, gv);
  }
  dq = concat_rows(dqs);
  dk = Tensor::empty(k.shape(), k.dtype(), k.device());
  dv = Tensor::empty(v.shape(), v.dtype(), v.device());
  cp.group->reduce_scatter(dka.raw(), dk.raw(), static_cast<size_t>(a.count), comm_type(k));
  cp.group->reduce_scatter(dva.raw(), dv.raw(), static_cast<size_t>(a.count), comm_type(v));
}

// ---- p2p, a2a and a2a+p2p: the all-to-all (if any), then the ring (if any).
void ring_forward(const Hierarchy& h, const Chunked& c, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                  Tensor& lse) {
  const std::vector<Tensor> qs = split_rows(q, c.L);
  std::vector<Tensor> outs(qs.size()), lses(qs.size());
  const int64_t j = h.ring_rank();
  Block cur{k, v, h.chunks(j)};
  for (int64_t t = 0; t < h.p; ++t) {
    // The next block is on its way while this one is attended to.
    RingExchange x;
    std::vector<Tensor> next;
    if (t + 1 < h.p) x.start(*h.ring, {cur.k, cur.v}, next);
    c.forward(qs, cur, outs, lses);
    x.wait();
    if (t + 1 < h.p) cur = Block{next[0], next[1], h.chunks((j + h.p - t - 1) % h.p)};
  }
  out = concat_rows(outs);
  lse = concat_lse(lses);
}

void ring_backward(const Hierarchy& h, const Chunked& c, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv) {
  const std::vector<Tensor> qs = split_rows(q, c.L), outs = split_rows(out, c.L), douts = split_rows(dout, c.L),
                            lses = split_lse(lse, c.L);
  std::vector<Tensor> dqs;
  for (const Tensor& x : qs) dqs.push_back(zeros_like(x));
  const int64_t j = h.ring_rank();
  Block cur{k, v, h.chunks(j)};
  // The gradient of the block in hand travels with it; after p steps each block's is home.
  Tensor gk = zeros_like(k), gv = zeros_like(v);
  for (int64_t t = 0; t < h.p; ++t) {
    RingExchange kv;
    std::vector<Tensor> next;
    if (t + 1 < h.p) kv.start(*h.ring, {cur.k, cur.v}, next);
    c.backward(qs, outs, lses, douts, cur, dqs, gk, gv);
    if (h.p > 1) {
      RingExchange g;
      std::vector<Tensor> back;
      g.start(*h.ring, {gk, gv}, back);
      g.wait();
      gk = back[0];
      gv = back[1];
    }
    kv.wait();
    if (t + 1 < h.p) cur = Block{next[0], next[1], h.chunks((j + h.p - t - 1) % h.p)};
  }
  dq = concat_rows(dqs);
  dk = gk;
  dv = gv;
}

void check_heads(const Hierarchy& h, const ops::AttentionShape& p) {
  MT_CHECK(p.Hq % h.a == 0 && p.Hkv % h.a == 0, "context parallelism: {} query and {} key/value heads over an "
           "all-to-all of {}", p.Hq, p.Hkv, h.a);
}

}  // namespace

void cp_attention_forward(const ContextParallel& cp, const ops::AttentionShape& p, const Tensor& q, const Tensor& k,
                          const Tensor& v, Tensor& out, Tensor& lse) {
  if (cp.comm_type == "allgather") return allgather_forward(cp, p, q, k, v, out, lse);
  const Hierarchy h = hierarchy(cp);
  check_heads(h, p);
  const Chunked c = engine(p, h.cp, h.chunks(h.ring_rank()), h.a);
  if (!h.a2a) return ring_forward(h, c, q, k, v, out, lse);
  Tensor o, l;
  ring_forward(h, c, seq_to_heads(q, *h.a2a), seq_to_heads(k, *h.a2a), seq_to_heads(v, *h.a2a), o, l);
  out = heads_to_seq(o, *h.a2a);
  lse = lse_to_seq(l, *h.a2a);
}

void cp_attention_backward(const ContextParallel& cp, const ops::AttentionShape& p, const Tensor& q, const Tensor& k,
                           const Tensor& v, const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dq,
                           Tensor& dk, Tensor& dv) {
  if (cp.comm_type == "allgather") return allgather_backward(cp, p, q, k, v, out, lse, dout, dq, dk, dv);
  const Hierarchy h = hierarchy(cp);
  check_heads(h, p);
  const Chunked c = engine(p, h.cp, h.chunks(h.ring_rank()), h.a);
  if (!h.a2a) return ring_backward(h, c, q, k, v, out, lse, dout, dq, dk, dv);
  comm::Communicator& g = *h.a2a;
  Tensor gq, gk, gv;
  ring_backward(h, c, seq_to_heads(q, g), seq_to_heads(k, g), seq_to_heads(v, g), seq_to_heads(out, g),
                lse_to_heads(lse, g), seq_to_heads(dout, g), gq, gk, gv);
  dq = heads_to_seq(gq, g);
  dk = heads_to_seq(gk, g);
  dv = heads_to_seq(gv, g);
}

}  // namespace mt::model
