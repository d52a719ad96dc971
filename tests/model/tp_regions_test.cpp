// Tensor-parallel regions: each mapping's forward and backward collective with and without
// sequence parallelism (the table in tp_regions.h), the identity without TP, all-reduces in
// place, the asynchronous forms, communication timing, and the collectives a Linear issues in
// each parallel mode. Ranks are a recording two-rank group: nothing is sent, every call is seen.
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/layers.h"
#include "model/recording_comm.h"
#include "model/tp_regions.h"

namespace mt::model {
namespace {

using Op = mt::testing::RecordingComm::Op;
using mt::testing::RecordingComm;

Tensor ones(const Shape& s) {
  Tensor t = Tensor::empty(s);
  t.fill_(1.f);
  return t;
}

std::vector<Op> ops_of(const RecordingComm& rec) {
  std::vector<Op> o;
  for (const auto& c : rec.calls) o.push_back(c.op);
  return o;
}

struct Fixture {
  RecordingComm rec;
  TensorParallel tp;
  explicit Fixture(bool sp) {
    tp.comm = &rec;
    tp.sequence_parallel = sp;
  }
};

TEST(TPRegions, TableWithoutSequenceParallelism) {
  Fixture f(false);
  using C = TPCollective;
  const TPRegion column(TPMapping::ColumnInput, &f.tp), row(TPMapping::RowOutput, &f.tp);
  const TPRegion features(TPMapping::Features, &f.tp);
  EXPECT_EQ(column.forward_collective(), C::Identity);
  EXPECT_EQ(column.backward_collective(), C::AllReduce);
  EXPECT_EQ(row.forward_collective(), C::AllReduce);
  EXPECT_EQ(row.backward_collective(), C::Identity);
  EXPECT_EQ(features.forward_collective(), C::AllGatherFeatures);
  EXPECT_EQ(features.backward_collective(), C::ReduceScatterFeatures);

  Tensor x = ones({4, 6});
  EXPECT_EQ(column.forward(x, nullptr).raw(), x.raw());  // identity: x itself, nothing sent
  EXPECT_EQ(row.backward(x, nullptr).raw(), x.raw());
  EXPECT_TRUE(f.rec.calls.empty());
  // The all-reduces sum in place: the partial sums are not needed after.
  EXPECT_EQ(column.backward(x, nullptr).raw(), x.raw());
  EXPECT_EQ(row.forward(x, nullptr).raw(), x.raw());
  ASSERT_EQ(ops_of(f.rec), (std::vector<Op>{Op::AllReduce, Op::AllReduce}));
  for (const auto& c : f.rec.calls) {
    EXPECT_EQ(c.buf, x.raw());
    EXPECT_EQ(c.count, 24u);
  }
  // Along the features: [4, 6] per rank <-> [4, 12].
  EXPECT_EQ(features.forward(x, nullptr).shape(), (Shape{4, 12}));
  EXPECT_EQ(features.backward(ones({4, 12}), nullptr).shape(), (Shape{4, 6}));
  EXPECT_EQ(ops_of(f.rec).back(), Op::ReduceScatter);
}

TEST(TPRegions, TableWithSequenceParallelism) {
  Fixture f(true);
  using C = TPCollective;
  const TPRegion column(TPMapping::ColumnInput, &f.tp), row(TPMapping::RowOutput, &f.tp);
  EXPECT_EQ(column.forward_collective(), C::AllGatherRows);
  EXPECT_EQ(column.backward_collective(), C::ReduceScatterRows);
  EXPECT_EQ(row.forward_collective(), C::ReduceScatterRows);
  EXPECT_EQ(row.backward_collective(), C::AllGatherRows);
  // Sequence shards of 4 rows <-> 8 rows on two ranks.
  EXPECT_EQ(column.forward(ones({4, 6}), nullptr).shape(), (Shape{8, 6}));
  EXPECT_EQ(column.backward(ones({8, 6}), nullptr).shape(), (Shape{4, 6}));
  EXPECT_EQ(row.forward(ones({8, 6}), nullptr).shape(), (Shape{4, 6}));
  EXPECT_EQ(row.backward(ones({4, 6}), nullptr).shape(), (Shape{8, 6}));
  EXPECT_EQ(ops_of(f.rec), (std::vector<Op>{Op::AllGather, Op::ReduceScatter, Op::ReduceScatter, Op::AllGather}));
}

TEST(TPRegions, IdentityWithoutTensorParallelism) {
  TensorParallel off;  // no group
  Tensor x = ones({4, 6});
  for (TPMapping m : {TPMapping::None, TPMapping::ColumnInput, TPMapping::RowOutput, TPMapping::Features}) {
    const TPRegion r(m, &off);
    EXPECT_EQ(r.forward_collective(), TPCollective::Identity);
    EXPECT_EQ(r.backward_collective(), TPCollective::Identity);
    EXPECT_EQ(r.forward(x, nullptr).raw(), x.raw());
    EXPECT_EQ(r.backward(x, nullptr).raw(), x.raw());
  }
  const TPRegion none;  // default: no group at all
  EXPECT_EQ(none.forward(x, nullptr).raw(), x.raw());
}

TEST(TPRegions, AsynchronousRowCollectives) {
  Fixture f(true);
  const TPRegion column(TPMapping::ColumnInput, &f.tp);
  TPRegion::InFlight gather = column.start_forward(ones({4, 6}), nullptr);
  EXPECT_EQ(gather.wait(nullptr).shape(), (Shape{8, 6}));
  EXPECT_THROW(gather.wait(nullptr), Error);  // once only
  TPRegion::InFlight scatter = column.start_backward(ones({8, 6}), nullptr);
  EXPECT_EQ(scatter.wait(nullptr).shape(), (Shape{4, 6}));
  EXPECT_EQ(ops_of(f.rec), (std::vector<Op>{Op::AllGather, Op::ReduceScatter}));
  Fixture nosp(false);  // the all-reduce and the identity have no asynchronous form
  const TPRegion c2(TPMapping::ColumnInput, &nosp.tp);
  EXPECT_THROW(c2.start_forward(ones({4, 6}), nullptr), Error);
  EXPECT_THROW(c2.start_backward(ones({4, 6}), nullptr), Error);
}

TEST(TPRegions, CollectivesAreTimedAsCommunication) {
  Fixture f(true);
  OpTimes t;
  const TPRegion column(TPMapping::ColumnInput, &f.tp);
  Fixture nosp(false);
  TPRegion(TPMapping::ColumnInput, &nosp.tp).forward(ones({4, 6}), &t);  // identity: no scope opened
  EXPECT_EQ(t.sum(), 0.0);
  column.forward(ones({4, 6}), &t);
  TPRegion::InFlight g = column.start_backward(ones({8, 6}), &t);
  g.wait(&t);
  EXPECT_GT(t.communication, 0.0);
  EXPECT_EQ(t.sum(), t.communication);
}

// The collectives a Linear issues, in order, forward then backward, per parallel mode.
struct LinearCase {
  ParallelMode mode;
  bool sp, overlap;
  std::vector<Op> forward, backward;
};

TEST(TPRegions, LinearIssuesItsModesCollectives) {
  const std::vector<LinearCase> cases = {
      {ParallelMode::Column, false, false, {}, {Op::AllReduce}},
      {ParallelMode::Column, true, false, {Op::AllGather}, {Op::AllGather, Op::ReduceScatter}},
      {ParallelMode::Column, true, true, {Op::AllGather}, {Op::AllGather, Op::ReduceScatter}},
      {ParallelMode::Row, false, false, {Op::AllReduce}, {}},
      {ParallelMode::Row, true, false, {Op::ReduceScatter}, {Op::AllGather}},
  };
  constexpr int64_t kIn = 8, kOut = 6, kRows = 8;  // full sizes; 2 ranks
  for (const LinearCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "mode " << static_cast<int>(c.mode) << " sp " << c.sp << " overlap "
                                    << c.overlap);
    Fixture f(c.sp);
    f.tp.overlap_comm = c.overlap;
    ParamStore ps;
    Linear lin;
    lin.build(ps, "l", kIn, kOut, true, Init::Normal, c.mode, &f.tp);
    ps.allocate(Half::None);
    ps.initialize(1, 0.02f, 1);
    const bool column = c.mode == ParallelMode::Column;
    const int64_t rows_in = c.sp && column ? kRows / 2 : kRows;    // a sequence shard enters
    const int64_t rows_out = c.sp && !column ? kRows / 2 : kRows;  // or leaves
    const Tensor x = ones({rows_in, column ? kIn : kIn / 2});
    PassContext ctx;
    const Tensor y = lin.forward(x, ctx);
    EXPECT_EQ(y.shape(), (Shape{rows_out, column ? kOut / 2 : kOut}));
    EXPECT_EQ(ops_of(f.rec), c.forward);
    f.rec.calls.clear();
    const Tensor dx = lin.backward(ones(y.shape()), x, ctx);
    EXPECT_EQ(dx.shape(), x.shape());
    EXPECT_EQ(ops_of(f.rec), c.backward);
  }
}

}  // namespace
}  // namespace mt::model
