#include "model/moe/token_dispatcher.h"

#include <algorithm>
#include <cstdint>
#include <numeric>

#include "core/error.h"
#include "kernels/host_mirror.h"
#include "kernels/ops.h"

namespace mt::model {
namespace {

// Activations travel in their own type (fp32, or the GPU's bf16/fp16, as the TP collectives);
// the router's probs and gradients in fp32, the routing map as I32.
comm::DataType comm_type(const Tensor& t) {
  switch (t.dtype()) {
    case DType::F32: return comm::DataType::F32;
    case DType::BF16: return comm::DataType::BF16;
    case DType::F16: return comm::DataType::F16;
    case DType::I32: return comm::DataType::I32;
    default: break;
  }
  MT_CHECK(false, "token dispatch of a {} tensor", dtype_name(t.dtype()));
  return comm::DataType::F32;
}

bool spans_ranks(const comm::Communicator* c) { return c && c->size() > 1; }

int64_t sum(const std::vector<int64_t>& v, size_t from = 0, size_t to = SIZE_MAX) {
  return std::accumulate(v.begin() + static_cast<std::ptrdiff_t>(from),
                         v.begin() + static_cast<std::ptrdiff_t>(std::min(to, v.size())), int64_t{0});
}

// [T, ...] on every member -> [G*T, ...], member i's rows at block i.
Tensor gather_rows(const Tensor& t, comm::Communicator& c) {
  Shape s = t.shape();
  s[0] *= c.size();
  Tensor out = Tensor::empty(s, t.dtype(), t.device());
  c.all_gather(t.raw(), out.raw(), static_cast<size_t>(t.numel()), comm_type(t));
  return out;
}

// [G*T, ...] partial sums on every member -> this member's [T, ...] block of the sum.
Tensor reduce_scatter_rows(const Tensor& t, comm::Communicator& c) {
  MT_CHECK(t.dim(0) % c.size() == 0, "{} rows do not split over the {} ranks of '{}'", t.dim(0), c.size(), c.name());
  Shape s = t.shape();
  s[0] /= c.size();
  Tensor out = Tensor::empty(s, t.dtype(), t.device());
  c.reduce_scatter(t.raw(), out.raw(), static_cast<size_t>(out.numel()), comm_type(t), comm::ReduceOp::Sum);
  return out;
}

// The dispatch plan of `map` (token_rows into s) and its per-expert row counts on the host: the
// experts' GEMM sizes, the one value the host reads per layer (a device sync on the GPU).
std::vector<int64_t> plan(const Tensor& map, TokenDispatcher::Saved& s) {
  Tensor counts_d;
  s.token_rows = ops::moe_dispatch_plan(map, counts_d);
  const Tensor c = counts_d.to_device(Device::CPU);
  return {c.data<int32_t>(), c.data<int32_t>() + c.numel()};
}

std::vector<int32_t> narrow(const std::vector<int64_t>& v) { return {v.begin(), v.end()}; }

// ---- allgather -------------------------------------------------------------------------------

class AllGatherDispatcher final : public TokenDispatcher {
 public:
  AllGatherDispatcher(comm::Communicator* group, int64_t first, int64_t local)
      : group_(spans_ranks(group) ? group : nullptr), first_(first), local_(local) {}

  Tensor dispatch(const Tensor& x, const Tensor& probs, const Tensor& map, Saved& s, std::vector<int64_t>& counts,
                  std::vector<int32_t>& routed, PassContext& ctx, const InFlight& in_flight) const override {
    if (in_flight) in_flight();  // the arguments allow the overlap with alltoall only, as Megatron's do
    Tensor xg = x, pg = probs, mg = map;
    if (group_) {
      ScopedOpTimer t(ctx.times, &OpTimes::communication);
      xg = gather_rows(x, *group_);
      pg = gather_rows(probs, *group_);
      mg = gather_rows(map, *group_);
    }
    ScopedOpTimer t(ctx.times, &OpTimes::permute);
    const std::vector<int64_t> all = plan(mg, s);
    // Every member of the group planned the same gathered tokens: its first member counts them.
    routed = !group_ || group_->rank() == 0 ? narrow(all) : std::vector<int32_t>(all.size(), 0);
    s.probs = pg;
    s.rows = sum(all);
    s.first_row = sum(all, 0, static_cast<size_t>(first_));
    counts.assign(all.begin() + first_, all.begin() + first_ + local_);
    s.local_rows = sum(counts);
    return local_part(ops::moe_permute(xg, s.token_rows, s.rows), s);
  }

  Tensor combine(const Tensor& yp, Saved& s, PassContext& ctx) const override {
    Tensor y;
    {
      ScopedOpTimer t(ctx.times, &OpTimes::unpermute);
      s.yp = whole(yp, s);
      y = ops::moe_unpermute(s.yp, s.token_rows, s.probs);
    }
    if (!group_) return y;
    ScopedOpTimer t(ctx.times, &OpTimes::communication);
    return reduce_scatter_rows(y, *group_);
  }

  Tensor combine_backward(const Tensor& dy, Saved& s, Tensor& dprobs, PassContext& ctx,
                          const InFlight& in_flight) const override {
    if (in_flight) in_flight();
    Tensor dyg = dy;
    if (group_) {
      ScopedOpTimer t(ctx.times, &OpTimes::communication);
      dyg = gather_rows(dy, *group_);
    }
    Tensor dyp;
    {
      ScopedOpTimer t(ctx.times, &OpTimes::unpermute);
      dyp = ops::moe_unpermute_backward(dyg, s.yp, s.token_rows, s.probs, dprobs);
      s.yp = Tensor();
    }
    if (group_) {
      // Other members' experts read 0 here (their rows of yp were zero on this rank); under
      // expert TP each member holds a partial sum. The sum over the group is the gradient.
      ScopedOpTimer t(ctx.times, &OpTimes::communication);
      dprobs = reduce_scatter_rows(dprobs, *group_);
    }
    return local_part(dyp, s);
  }

  Tensor dispatch_backward(const Tensor& dxp, Saved& s, PassContext& ctx) const override {
    Tensor dx;
    {
      ScopedOpTimer t(ctx.times, &OpTimes::permute);
      dx = ops::moe_permute_backward(whole(dxp, s), s.token_rows);
    }
    s = Saved{};
    if (!group_) return dx;
    ScopedOpTimer t(ctx.times, &OpTimes::communication);
    return reduce_scatter_rows(dx, *group_);
  }

 private:
  // The local experts' rows of a tensor in plan order (a copy, so the rest can be freed).
  static Tensor local_part(const Tensor& t, const Saved& s) {
    if (s.local_rows == s.rows) return t;
    Tensor out = Tensor::empty({s.local_rows, t.dim(1)}, t.dtype(), t.device());
    if (s.local_rows > 0) ops::copy_into(out, t.slice(s.first_row, s.local_rows));
    return out;
  }
  // The local experts' rows placed in a plan-order tensor whose other rows are zero.
  static Tensor whole(const Tensor& t, const Saved& s) {
    if (s.local_rows == s.rows) return t;
    Tensor out = Tensor::zeros({s.rows, t.dim(1)}, t.dtype(), t.device());
    if (s.local_rows > 0) {
      Tensor rows = out.slice(s.first_row, s.local_rows);
      ops::copy_into(rows, t);
    }
    return out;
  }

  comm::Communicator* group_;  // null: a group of one
  int64_t first_, local_;      // this rank's experts [first, first + local)
};

// ---- alltoall --------------------------------------------------------------------------------

// Rows of `in` in chunks ordered (a, b), a-major, chunk (a, b) holding sizes[a * nb + b] rows ->
// the same chunks ordered (b, a), b-major (Megatron's sort_chunks_by_idxs for this transpose).
Tensor transpose_chunks(const Tensor& in, const std::vector<int64_t>& sizes, int64_t na, int64_t nb) {
  std::vector<int64_t> start(sizes.size());
  std::exclusive_scan(sizes.begin(), sizes.end(), start.begin(), int64_t{0});
  Tensor out = Tensor::empty(in.shape(), in.dtype(), in.device());
  int64_t pos = 0;
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t a = 0; a < na; ++a) {
      const size_t k = static_cast<size_t>(a * nb + b);
      if (sizes[k] > 0) {
        Tensor rows = out.slice(pos, sizes[k]);
        ops::copy_into(rows, in.slice(start[k], sizes[k]));
      }
      pos += sizes[k];
    }
  return out;
}

// sizes of an (a, b) chunk grid listed b-major.
std::vector<int64_t> transposed(const std::vector<int64_t>& sizes, int64_t na, int64_t nb) {
  std::vector<int64_t> t(sizes.size());
  for (int64_t a = 0; a < na; ++a)
    for (int64_t b = 0; b < nb; ++b) t[static_cast<size_t>(b * na + a)] = sizes[static_cast<size_t>(a * nb + b)];
  return t;
}

// Rows per member from rows per (member, local expert).
std::vector<int64_t> per_member(const std::vector<int64_t>& chunks, int64_t members) {
  const size_t per = chunks.size() / static_cast<size_t>(members);
  std::vector<int64_t> rows(static_cast<size_t>(members));
  for (size_t m = 0; m < rows.size(); ++m) rows[m] = sum(chunks, m * per, (m + 1) * per);
  return rows;
}

// All-to-all-v of [rows, h] tensors: send_rows[i] rows to member i, recv_rows[i] from it, into
// `out`. `in` and `out` must live until the returned work has been waited on.
comm::WorkHandle exchange_rows_async(const Tensor& in, const std::vector<int64_t>& send_rows,
                                     const std::vector<int64_t>& recv_rows, comm::Communicator& c, Tensor& out) {
  const int64_t h = in.dim(1);
  out = Tensor::empty({sum(recv_rows), h}, in.dtype(), in.device());
  std::vector<size_t> sc(send_rows.size()), rc(recv_rows.size());
  for (size_t i = 0; i < sc.size(); ++i) {
    sc[i] = static_cast<size_t>(send_rows[i] * h);
    rc[i] = static_cast<size_t>(recv_rows[i] * h);
  }
  return c.all_to_all_v_async(in.numel() > 0 ? in.raw() : nullptr, sc, out.numel() > 0 ? out.raw() : nullptr, rc,
                              comm_type(in));
}

Tensor exchange_rows(const Tensor& in, const std::vector<int64_t>& send_rows, const std::vector<int64_t>& recv_rows,
                     comm::Communicator& c) {
  Tensor out;
  exchange_rows_async(in, send_rows, recv_rows, c, out)->wait();
  return out;
}

// Expert TP under alltoall (Megatron's): the members of an ETP group received different tokens
// from their EP exchanges, and each runs its shard of fc1/fc2 on all of them. Rows in, gathered
// over ETP (rows[i] from member i, at block i): an all-to-all-v that sends this member's block
// to every member, from one copy per member.
Tensor gather_rows_v(const Tensor& in, const std::vector<int64_t>& rows, comm::Communicator& c) {
  const int64_t n = in.dim(0), members = c.size();
  Tensor copies = Tensor::empty({members * n, in.dim(1)}, in.dtype(), in.device());
  if (n > 0)
    for (int64_t i = 0; i < members; ++i) {
      Tensor rows = copies.slice(i * n, n);
      ops::copy_into(rows, in);
    }
  return exchange_rows(copies, std::vector<int64_t>(rows.size(), n), rows, c);
}

// Partial sums out, the reverse: member i gets the sum over members of their block i (blocks of
// rows[i] rows), added in member order so every rank sums alike.
Tensor reduce_scatter_rows_v(const Tensor& in, const std::vector<int64_t>& rows, comm::Communicator& c) {
  const int64_t n = rows[static_cast<size_t>(c.rank())];
  const Tensor parts = exchange_rows(in, rows, std::vector<int64_t>(rows.size(), n), c);
  Tensor out = Tensor::empty({n, in.dim(1)}, in.dtype(), in.device());
  if (n == 0) return out;
  ops::copy_into(out, parts.slice(0, n));
  for (int64_t i = 1; i < c.size(); ++i) ops::add_inplace(out, parts.slice(i * n, n));
  return out;
}

class AllToAllDispatcher final : public TokenDispatcher {
 public:
  AllToAllDispatcher(comm::Communicator* ep, comm::Communicator* etp, int64_t local)
      : ep_(spans_ranks(ep) ? ep : nullptr), etp_(spans_ranks(etp) ? etp : nullptr), local_(local) {}

  Tensor dispatch(const Tensor& x, const Tensor& probs, const Tensor& map, Saved& s, std::vector<int64_t>& counts,
                  std::vector<int32_t>& routed, PassContext& ctx, const InFlight& in_flight) const override {
    Tensor xp;
    std::vector<int64_t> all;
    {
      ScopedOpTimer t(ctx.times, &OpTimes::permute);
      if (s.expected_rows >= 0) {
        // The host reads the counts (a wait for the device) after the permute is queued, so the
        // GPU has that work in hand while the host wakes up and launches the experts' GEMMs.
        Tensor counts_d;
        s.token_rows = ops::moe_dispatch_plan(map, counts_d);
        counts_mirror_.start({counts_d});
        xp = ops::moe_permute(x, s.token_rows, s.expected_rows);
        const std::vector<int32_t> c = counts_mirror_.wait_i32();
        all.assign(c.begin(), c.end());
        MT_CHECK(sum(all) == s.expected_rows, "moe dispatch: the plan has {} rows, {} expected (dropless)", sum(all),
                 s.expected_rows);
      } else {
        all = plan(map, s);
        xp = ops::moe_permute(x, s.token_rows, sum(all));
      }
      routed = narrow(all);  // this rank's own tokens
      s.probs = probs;
      s.rows = sum(all);
    }
    if (!ep_ && !etp_) {
      if (in_flight) in_flight();
      counts = all;
      return xp;
    }
    exchange_counts(all, s, counts, ctx);
    const Tensor rows = from_sources(xp, s, in_flight, ctx);
    ScopedOpTimer t(ctx.times, &OpTimes::communication);
    return sorted(rows, s);  // (ETP member, EP member, expert) -> (expert, ...)
  }

  Tensor combine(const Tensor& yp, Saved& s, PassContext& ctx) const override {
    s.yp = yp;
    if (ep_ || etp_) {
      ScopedOpTimer t(ctx.times, &OpTimes::communication);
      s.yp = to_sources(unsorted(yp, s), s);
    }
    ScopedOpTimer t(ctx.times, &OpTimes::unpermute);
    return ops::moe_unpermute(s.yp, s.token_rows, s.probs);
  }

  Tensor combine_backward(const Tensor& dy, Saved& s, Tensor& dprobs, PassContext& ctx,
                          const InFlight& in_flight) const override {
    Tensor dyp;
    {
      ScopedOpTimer t(ctx.times, &OpTimes::unpermute);
      dyp = ops::moe_unpermute_backward(dy, s.yp, s.token_rows, s.probs, dprobs);
      s.yp = Tensor();
    }
    if (!ep_ && !etp_) {
      if (in_flight) in_flight();
      return dyp;
    }
    const Tensor rows = from_sources(dyp, s, in_flight, ctx);
    ScopedOpTimer t(ctx.times, &OpTimes::communication);
    return sorted(rows, s);
  }

 private:
  // The plan's counts `all` (rows per expert of this rank's tokens) -> s.send_chunks/recv_chunks
  // and the local experts' row counts.
  void exchange_counts(const std::vector<int64_t>& all, Saved& s, std::vector<int64_t>& counts,
                       PassContext& ctx) const {
    ScopedOpTimer t(ctx.times, &OpTimes::communication);
    // How many rows each EP member sends to each of this rank's experts, exchanged on the host
    // (where the plan's counts are already): with the ETP gather below, the host-side values of
    // the layer's forward besides the plan's counts; the backward reuses them all.
    s.send_chunks = all;
    s.recv_chunks = all;
    if (ep_) {
      std::vector<int32_t> send(all.begin(), all.end()), recv(all.size());
      ep_->all_to_all(send.data(), recv.data(), static_cast<size_t>(local_), comm::DataType::I32);
      s.recv_chunks.assign(recv.begin(), recv.end());
    }
    if (etp_) {  // every ETP member's received chunks, member after member
      const std::vector<int32_t> mine(s.recv_chunks.begin(), s.recv_chunks.end());
      std::vector<int32_t> every(mine.size() * static_cast<size_t>(etp_->size()));
      etp_->all_gather(mine.data(), every.data(), mine.size(), comm::DataType::I32);
      s.recv_chunks.assign(every.begin(), every.end());
    }
    const int64_t sources = sources_of(s);
    counts.assign(static_cast<size_t>(local_), 0);
    for (int64_t src = 0; src < sources; ++src)
      for (int64_t e = 0; e < local_; ++e)
        counts[static_cast<size_t>(e)] += s.recv_chunks[static_cast<size_t>(src * local_ + e)];
  }

 public:

  Tensor dispatch_backward(const Tensor& dxp, Saved& s, PassContext& ctx) const override {
    Tensor back = dxp;
    if (ep_ || etp_) {
      ScopedOpTimer t(ctx.times, &OpTimes::communication);
      back = to_sources(unsorted(dxp, s), s);
    }
    Tensor dx;
    {
      ScopedOpTimer t(ctx.times, &OpTimes::permute);
      dx = ops::moe_permute_backward(back, s.token_rows);
    }
    s = Saved{};
    return dx;
  }

 private:
  int64_t ep_size() const { return ep_ ? ep_->size() : 1; }
  int64_t etp_size() const { return etp_ ? etp_->size() : 1; }
  // Chunk sources of the sorted rows: (ETP member, EP member) pairs.
  int64_t sources_of(const Saved& s) const { return static_cast<int64_t>(s.recv_chunks.size()) / local_; }
  // Rows each ETP member received from its EP exchange.
  std::vector<int64_t> etp_rows(const Saved& s) const { return per_member(s.recv_chunks, etp_size()); }
  // This rank's own EP exchange: rows per (EP member, expert) it received.
  std::vector<int64_t> ep_recv(const Saved& s) const {
    const size_t n = static_cast<size_t>(ep_size() * local_), at = etp_ ? static_cast<size_t>(etp_->rank()) * n : 0;
    return {s.recv_chunks.begin() + static_cast<std::ptrdiff_t>(at),
            s.recv_chunks.begin() + static_cast<std::ptrdiff_t>(at + n)};
  }
  // This rank's expert-major rows (all experts) -> the rows of its experts from every source,
  // in (ETP member, EP member, expert) order. `in_flight` runs while the EP exchange is under way,
  // outside the communication timer.
  Tensor from_sources(const Tensor& xp, const Saved& s, const InFlight& in_flight, PassContext& ctx) const {
    Tensor r = xp;
    comm::WorkHandle w;
    if (ep_) {
      ScopedOpTimer t(ctx.times, &OpTimes::communication);
      w = exchange_rows_async(xp, per_member(s.send_chunks, ep_size()), per_member(ep_recv(s), ep_size()), *ep_, r);
    }
    if (in_flight) in_flight();
    ScopedOpTimer t(ctx.times, &OpTimes::communication);
    if (w) w->wait();
    return etp_ ? gather_rows_v(r, etp_rows(s), *etp_) : r;
  }
  // The reverse: rows in (ETP member, EP member, expert) order, partial over ETP -> summed over
  // ETP and back to the EP members whose tokens they are, in their plans' row order.
  Tensor to_sources(const Tensor& rows, const Saved& s) const {
    const Tensor r = etp_ ? reduce_scatter_rows_v(rows, etp_rows(s), *etp_) : rows;
    return ep_ ? exchange_rows(r, per_member(ep_recv(s), ep_size()), per_member(s.send_chunks, ep_size()), *ep_) : r;
  }
  // (source, expert) chunks -> (expert, source) and back (Megatron's sort_chunks_by_idxs).
  Tensor sorted(const Tensor& rows, const Saved& s) const {
    return transpose_chunks(rows, s.recv_chunks, sources_of(s), local_);
  }
  Tensor unsorted(const Tensor& rows, const Saved& s) const {
    const int64_t src = sources_of(s);
    return transpose_chunks(rows, transposed(s.recv_chunks, src, local_), local_, src);
  }

  mutable ops::HostMirror counts_mirror_;  // the plan's per-expert counts, read by the host
  comm::Communicator* ep_;   // null: a group of one
  comm::Communicator* etp_;  // null: experts whole
  int64_t local_;            // experts per EP member
};

}  // namespace

std::shared_ptr<const TokenDispatcher> make_token_dispatcher(const std::string& type, const ExpertParallel& ep,
                                                             int64_t num_experts) {
  const int64_t G = ep.ep_size();
  MT_CHECK(num_experts % G == 0, "{} experts over {} expert-parallel ranks", num_experts, G);
  const int64_t local = num_experts / G, first = ep.ep_rank() * local;
  if (type == "allgather") return std::make_shared<AllGatherDispatcher>(ep.tp_ep, first, local);
  MT_CHECK(type == "alltoall", "unknown token dispatcher '{}'", type);
  return std::make_shared<AllToAllDispatcher>(ep.ep, ep.etp, local);
}

}  // namespace mt::model
