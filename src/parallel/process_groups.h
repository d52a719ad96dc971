#pragma once
// The process groups one rank takes part in, built from the rank grid (Megatron's
// parallel_state, passed around instead of held globally).
#include "comm/communicator.h"
#include "comm/world.h"
#include "parallel/grid.h"

namespace mt::parallel {

struct ProcessGroups {
  RankGrid grid{1, 1, 1};
  int rank = 0;                 // world rank
  comm::CommPtr world;          // every rank
  comm::CommPtr tp;             // tensor-parallel group
  comm::CommPtr dp;             // data-parallel group (gradient reduction when CP = 1)
  comm::CommPtr dp_cp;          // data x context parallel (gradient reduction with CP)
  comm::CommPtr cp;             // context-parallel group
  // --cp-comm-type a2a+p2p: CP rank c = i + A * j (A the all-to-all size); the all-to-all group
  // holds the CP ranks of one j, the ring those of one i. Null otherwise.
  comm::CommPtr cp_a2a, cp_ring;
  comm::CommPtr pp;             // pipeline group
  comm::CommPtr mp;             // model-parallel group (TP x PP): grad-norm reduction
  comm::CommPtr embedding;      // first and last pipeline stages (tied embeddings)
  // The expert grid (grid.h: etp-ep-edp over the same ranks of each pipeline stage).
  comm::CommPtr ep;             // expert-model-parallel group: holds the experts between them
  comm::CommPtr etp;            // expert-tensor-parallel group: splits each expert's fc1/fc2
  comm::CommPtr edp;            // expert-data-parallel group: expert gradient reduction
  comm::CommPtr tp_ep;          // ETP x EP: the allgather token dispatcher's group
  comm::CommPtr expert_mp;      // ETP x EP x PP: the expert part of the grad norm
  int tp_rank() const { return tp->rank(); }
  int dp_rank() const { return dp->rank(); }
};

// Builds this rank's groups (collective with every rank). Groups that hold every rank reuse
// the world communicator; groups of one cost nothing.
// cp_a2a_size > 1 also builds the hierarchical context-parallel groups (a2a+p2p).
ProcessGroups build_process_groups(comm::World& world, const RankGrid& grid, int cp_a2a_size = 1);
// A single process: every group is the process itself.
ProcessGroups local_process_groups();

}  // namespace mt::parallel
