#include "parallel/process_groups.h"

#include <algorithm>
#include <map>

#include "comm/local_communicator.h"

namespace mt::parallel {

ProcessGroups build_process_groups(comm::World& world, const RankGrid& grid, int cp_a2a_size) {
  MT_CHECK(grid.world() == world.size(), "grid of {} ranks for a world of {}", grid.world(), world.size());
  ProcessGroups g;
  g.grid = grid;
  g.rank = world.rank();
  g.world = world.world();
  // Every rank creates its groups in this same order, so members meet in the same rendezvous.
  // Same member list, same communicator (dp and dp-cp when CP = 1, tp and tp-pp when PP = 1).
  std::map<std::vector<int>, comm::CommPtr> made;
  const RankGrid eg = grid.expert_grid();
  auto make = [&](const std::string& dims, const RankGrid* on = nullptr) -> comm::CommPtr {
    std::vector<int> members = (on ? *on : grid).group(g.rank, dims);
    if (static_cast<int>(members.size()) == world.size()) return world.world();
    auto it = made.find(members);
    if (it != made.end()) return it->second;
    return made[members] = world.new_group(dims, members);
  };
  g.tp = make("tp");
  g.cp = make("cp");
  g.dp = make("dp");
  g.dp_cp = make("dp-cp");
  g.pp = make("pp");
  g.mp = make("tp-pp");
  g.ep = make("ep", &eg);
  g.etp = make("etp", &eg);
  g.edp = make("edp", &eg);
  g.tp_ep = make("etp-ep", &eg);
  g.expert_mp = make("etp-ep-pp", &eg);
  if (cp_a2a_size > 1 && grid.cp() > cp_a2a_size) {
    MT_CHECK(grid.cp() % cp_a2a_size == 0, "all-to-all size {} does not divide CP {}", cp_a2a_size, grid.cp());
    const std::vector<int> cp = grid.group(g.rank, "cp");
    const int c = g.cp->rank(), a = cp_a2a_size;
    std::vector<int> inner, outer;
    for (int x = 0; x < grid.cp(); ++x) {
      if (x / a == c / a) inner.push_back(cp[static_cast<size_t>(x)]);
      if (x % a == c % a) outer.push_back(cp[static_cast<size_t>(x)]);
    }
    // Every member makes its all-to-all group before its ring, so the rendezvous never cross.
    g.cp_a2a = world.new_group("cp-a2a", inner);
    g.cp_ring = world.new_group("cp-ring", outer);
  }
  auto emb = grid.embedding_group(g.rank);
  g.embedding = static_cast<int>(emb.size()) == world.size()
                    ? world.world()
                    : (std::find(emb.begin(), emb.end(), g.rank) != emb.end()
                           ? world.new_group("embedding", emb)
                           : comm::CommPtr(std::make_shared<comm::LocalCommunicator>("embedding", g.rank)));
  return g;
}

ProcessGroups local_process_groups() {
  ProcessGroups g;
  auto one = [](const char* n) { return std::make_shared<comm::LocalCommunicator>(n, 0); };
  g.world = one("world");
  g.tp = one("tp");
  g.cp = one("cp");
  g.dp = one("dp");
  g.dp_cp = one("dp-cp");
  g.pp = one("pp");
  g.mp = one("tp-pp");
  g.embedding = one("embedding");
  g.ep = one("ep");
  g.etp = one("etp");
  g.edp = one("edp");
  g.tp_ep = one("etp-ep");
  g.expert_mp = one("etp-ep-pp");
  return g;
}

}  // namespace mt::parallel
