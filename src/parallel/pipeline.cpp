#include "parallel/pipeline.h"

#include <algorithm>
#include <list>
#include <map>

#include "core/error.h"
#include "kernels/profiler.h"
#include "parallel/schedule.h"

namespace mt::parallel {

namespace {

comm::DataType comm_type(const Tensor& t) {
  switch (t.dtype()) {
    case DType::F32:
      return comm::DataType::F32;
    case DType::BF16:
      return comm::DataType::BF16;
    case DType::F16:
      return comm::DataType::F16;
    default:
      break;
  }
  throw Error("pipeline activations must be fp32, bf16 or fp16");
}

// The point-to-point traffic of one batch on one rank, keyed by the pass that consumes each
// message (kind, chunk and micro-batch on the receiving rank).
class Exchange {
 public:
  Exchange(comm::Communicator& pp, const ScheduleSpec& mine, const std::vector<model::Batch>& batches,
           const model::GPTModel& model)
      : pp_(pp), spec_(mine), batches_(batches), model_(model) {
    const int P = mine.pp, r = mine.rank;
    for (int p : {(r - 1 + P) % P, (r + 1) % P}) {
      if (p == r || peers_.count(p)) continue;
      ScheduleSpec s = mine;
      s.rank = p;
      Peer& peer = peers_[p];
      const std::vector<Action> passes = build_schedule(s);
      for (size_t i = 0; i < passes.size(); ++i) {
        peer.index[passes[i]] = i;
        if (pass_comm(passes[i], P, mine.vpp, p).send_to == r)
          peer.incoming.push_back({consumer_of(passes[i], P, p), i});
      }
    }
  }

  // Posts the receive of `pass`'s input (and of everything the sender sends before it).
  void prefetch(const Action& pass) {
    const int from = pass_comm(pass, spec_.pp, spec_.vpp, spec_.rank).recv_from;
    if (from >= 0) post_until(from, pass);
  }

  // The input of `pass` from the previous (forward) or next (backward) stage; empty if none.
  Tensor take(const Action& pass) {
    const int from = pass_comm(pass, spec_.pp, spec_.vpp, spec_.rank).recv_from;
    if (from < 0) return Tensor();
    Peer& peer = peers_.at(from);
    post_until(from, pass);
    auto it = peer.posted.find(pass);
    Posted got = std::move(it->second);
    peer.posted.erase(it);
    got.work->wait();
    // The sender consumed everything of ours that it waited for before this send: those
    // transfers are done, so waiting for them cannot block, and their buffers can go.
    reap([&](const Outgoing& o) { return o.peer == from && o.consumed_at <= got.sent_after; });
    return got.buf;
  }

  // Sends `pass`'s output (forward) or input gradient (backward) on, if it goes anywhere.
  void give(const Action& pass, const Tensor& t) {
    const int to = pass_comm(pass, spec_.pp, spec_.vpp, spec_.rank).send_to;
    if (to < 0) return;
    MT_CHECK(t.defined(), "pass of micro-batch {} has nothing to send", pass.microbatch);
    Peer& peer = peers_.at(to);
    const size_t consumed_at = peer.index.at(consumer_of(pass, spec_.pp, spec_.rank));
    // Forward-only without virtual stages is a chain: the receiver needs nothing from us but
    // the data, so waiting for our previous send bounds the buffers without risking a cycle.
    if (spec_.forward_only && spec_.vpp == 1) reap([&](const Outgoing& o) { return o.peer == to; });
    Outgoing o{t, nullptr, to, consumed_at};
    o.work = guarded("sending to", to,
                     [&] { return pp_.send_async(t.raw(), static_cast<size_t>(t.numel()), comm_type(t), to); });
    sends_.push_back(std::move(o));
  }

  // End of the batch: every rank posts all its receives before it gets here, so every send completes.
  void finish() {
    reap([](const Outgoing&) { return true; });
    for (auto& [p, peer] : peers_)
      MT_CHECK(peer.next_post == peer.incoming.size() && peer.posted.empty(),
               "pipeline rank {}: {} message(s) from rank {} were never consumed", spec_.rank,
               peer.incoming.size() - peer.next_post + peer.posted.size(), p);
  }

 private:
  struct Incoming {
    Action consumer;
    size_t sent_after;  // the sender's pass index that sends it
  };
  struct Posted {
    Tensor buf;  // declared before the handle: the transfer is gone before its buffer
    comm::WorkHandle work;
    size_t sent_after = 0;
  };
  struct Outgoing {
    Tensor buf;
    comm::WorkHandle work;
    int peer = -1;
    size_t consumed_at = 0;  // the receiver's pass index that waits for it
  };
  struct Peer {
    std::vector<Incoming> incoming;  // in the peer's send order
    size_t next_post = 0;
    std::map<Action, Posted> posted;
    std::map<Action, size_t> index;  // the peer's passes -> position in its schedule
  };

  void post_until(int from, const Action& pass) {
    Peer& peer = peers_.at(from);
    while (!peer.posted.count(pass)) {
      MT_CHECK(peer.next_post < peer.incoming.size(), "pipeline rank {} expects no message from rank {} for {} {}.{}",
               spec_.rank, from, pass.kind == Action::Forward ? "forward" : "backward", pass.chunk, pass.microbatch);
      const Incoming& in = peer.incoming[peer.next_post++];
      const model::Batch& b = batches_[static_cast<size_t>(in.consumer.microbatch)];
      Posted p;
      // Hidden states travel in the compute precision: fp32 on the CPU, the model's bf16 or fp16
      // on the GPU.
      DType dt = DType::F32;
      if (model_.device() != Device::CPU) dt = model_.config().fp16 ? DType::F16 : DType::BF16;
      p.buf = Tensor::empty({model_.activation_rows(b.B, b.S), model_.config().hidden_size}, dt, model_.device());
      p.sent_after = in.sent_after;
      p.work = guarded("receiving from", from, [&] {
        return pp_.recv_async(p.buf.raw(), static_cast<size_t>(p.buf.numel()), comm_type(p.buf), from);
      });
      peer.posted.emplace(in.consumer, std::move(p));
    }
  }

  // Posting a transfer to a peer whose connection is already gone fails in the transport; say
  // which rank it was, as waiting on a transfer does.
  template <typename F>
  comm::WorkHandle guarded(const char* what, int peer, F&& post) {
    try {
      return post();
    } catch (const comm::CommError&) {
      throw;
    } catch (const std::exception& e) {
      throw comm::CommError(
          fmt::format("pipeline stage {} {} world rank {} (stage {}) failed: {}; that rank has "
                      "probably exited or crashed",
                      spec_.rank, what, pp_.world_ranks()[static_cast<size_t>(peer)], peer, e.what()));
    }
  }

  template <typename Pred>
  void reap(Pred&& done) {
    for (auto it = sends_.begin(); it != sends_.end();) {
      if (!done(*it)) {
        ++it;
        continue;
      }
      it->work->wait();
      it = sends_.erase(it);
    }
  }

  comm::Communicator& pp_;
  ScheduleSpec spec_;
  const std::vector<model::Batch>& batches_;
  const model::GPTModel& model_;
  std::map<int, Peer> peers_;
  std::list<Outgoing> sends_;
};

}  // namespace

PipelineRunner::PipelineRunner(model::GPTModel& model, comm::CommPtr pp, int64_t group)
    : model_(model), pp_(std::move(pp)), group_(group) {
  // Collective over the pipeline group: messages go to the previous and next stage only.
  const int P = pp_->size(), r = pp_->rank();
  if (P == 1) return;
  std::vector<int> peers{(r + P - 1) % P};
  if ((r + 1) % P != peers[0]) peers.push_back((r + 1) % P);
  pp_->prepare_p2p(peers);
}

model::LossSums PipelineRunner::train(const std::vector<model::Batch>& batches, float loss_grad_scale,
                                      const model::PassContext& ctx, DataParallel* ddp) {
  return run(batches, false, loss_grad_scale, ctx, ddp);
}

model::LossSums PipelineRunner::evaluate(const std::vector<model::Batch>& batches, const model::PassContext& ctx) {
  return run(batches, true, 0.f, ctx, nullptr);
}

model::LossSums PipelineRunner::run(const std::vector<model::Batch>& batches, bool forward_only, float loss_grad_scale,
                                    const model::PassContext& base, DataParallel* ddp) {
  const int64_t M = static_cast<int64_t>(batches.size());
  MT_CHECK(M > 0, "a pipeline step without micro-batches");
  ScheduleSpec spec{pp_->size(), model_.num_chunks(), pp_->rank(), M, group_, forward_only};
  const std::vector<Action> passes = build_schedule(spec);
  Exchange x(*pp_, spec, batches, model_);
  std::map<std::pair<int, int64_t>, model::GPTModel::Saved> saved;  // (chunk, micro-batch)
  model::LossSums total;
  max_in_flight_ = 0;
  for (size_t k = 0; k < passes.size(); ++k) {
    const Action& a = passes[k];
    x.prefetch(a);
    if (k + 1 < passes.size()) x.prefetch(passes[k + 1]);  // arrives while this pass computes
    const bool fwd = a.kind == Action::Forward;
    PhaseTimer* timer = forward_only ? nullptr : phase_timer_;  // Megatron times training steps only
    Tensor in;
    {
      PhaseScope t(timer, fwd ? "forward-recv" : "backward-recv");
      in = x.take(a);
    }
    model::PassContext ctx = base;
    // Training: the head may form its logits' gradient in the forward (fused cross-entropy).
    if (!forward_only) ctx.loss_grad_scale = loss_grad_scale;
    if (ddp) {
      // Only a chunk's last micro-batch may start its gradient buckets' reduction.
      ddp->set_last_microbatch(a.microbatch + 1 == M);
      ctx.hooks = ddp->needs_hooks() ? ddp : nullptr;
    }
    const model::Batch& batch = batches[static_cast<size_t>(a.microbatch)];
    const ops::NvtxRange range("{} chunk {} micro-batch {}", a.kind == Action::Forward ? "forward" : "backward", a.chunk,
                               a.microbatch);
    if (a.kind == Action::Forward) {
      model::GPTModel::Saved& s = saved[{a.chunk, a.microbatch}];
      model::LossSums ls;
      Tensor out;
      {
        PhaseScope t(timer, "forward-compute");
        out = model_.forward_chunk(a.chunk, batch, in, s, ctx, &ls);
      }
      total.loss_sum += ls.loss_sum;  // micro-batch order on the last stage, as on one rank
      total.tokens += ls.tokens;
      max_in_flight_ = std::max<int64_t>(max_in_flight_, static_cast<int64_t>(saved.size()));
      if (forward_only) saved.erase({a.chunk, a.microbatch});
      PhaseScope t(timer, "forward-send");
      x.give(a, out);
    } else {
      auto it = saved.find({a.chunk, a.microbatch});
      MT_CHECK(it != saved.end(), "backward of micro-batch {} chunk {} before its forward", a.microbatch, a.chunk);
      Tensor dx;
      {
        PhaseScope t(timer, "backward-compute");
        dx = model_.backward_chunk(a.chunk, it->second, in, loss_grad_scale, ctx);
      }
      saved.erase(it);  // activations go as soon as their backward ran
      PhaseScope t(timer, "backward-send");
      x.give(a, dx);
    }
  }
  x.finish();
  MT_CHECK(saved.empty(), "{} micro-batch pass(es) left without backward", saved.size());
  return total;
}

}  // namespace mt::parallel
