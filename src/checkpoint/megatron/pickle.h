#pragma once
// A restricted reader of Python pickles (the .metadata of a PyTorch distributed checkpoint and
// the data.pkl of a torch.save zip), for Megatron-LM checkpoints. It never runs code: it builds
// an inert tree of values. A class or function the pickle names (GLOBAL / STACK_GLOBAL) must be
// on a short allow-list of the ones these files use (tensor rebuild, storages, OrderedDict,
// torch.Size and dtypes, argparse.Namespace, DCP's metadata dataclasses and a few enums);
// anything else is refused with an error naming module.name. Calls (REDUCE, NEWOBJ) and BUILD
// only record their callee, arguments and state for the caller to interpret. Only the opcodes
// these files use are understood; lengths are checked against the input, the memo and the tree
// are bounded, and recursive structures (a list that contains itself) are refused.
#include <cstdint>
#include <string>
#include <vector>

namespace mt::checkpoint::pickle {

enum class Kind { None, Bool, Int, Float, Str, Bytes, Tuple, List, Dict, Global, Call, PersId };

// A node of the tree. Children are indices into Pickle::nodes:
//   Tuple, List: items; Dict: key0, value0, key1, value1, ...;
//   Call: items[0] the callee (a Global), items[1] its argument tuple, items[2] the state BUILD
//         gave it (-1: none); `b` is set for NEWOBJ (cls.__new__(cls, *args), dataclasses)
//         rather than REDUCE (callee(*args));
//   PersId: items[0] the persistent id (torch.save: ('storage', type, key, location, numel)).
struct Node {
  Kind kind = Kind::None;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;     // Str, Bytes; Global: the module
  std::string name;  // Global: the name
  std::vector<int64_t> items;
};

struct Limits {
  int64_t max_nodes = 20'000'000;
  int64_t max_memo = 10'000'000;
  int64_t max_depth = 200;  // nesting of containers and calls
};

class Pickle {
 public:
  std::vector<Node> nodes;
  int64_t root = -1;

  const Node& at(int64_t i) const { return nodes.at(static_cast<size_t>(i)); }
  const Node& top() const { return at(root); }
  // Dict lookup by string key (-1: absent; the node must be a Dict).
  int64_t get(int64_t dict, const std::string& key) const;
  // The callee's "module.name" of a Call ("" for other kinds).
  std::string callee(int64_t call) const;
};

// Parses `size` bytes; `where` names the file in errors. Throws mt::Error.
Pickle parse(const uint8_t* data, size_t size, const std::string& where, const Limits& lim = {});

// Whether `module`.`name` is on the allow-list.
bool allowed_global(const std::string& module, const std::string& name);

// Building trees to write (pickle_writer.cpp). Each returns the new node's index.
class Builder {
 public:
  Pickle pk;
  int64_t none();
  int64_t boolean(bool v);
  int64_t integer(int64_t v);
  int64_t real(double v);
  int64_t str(const std::string& v);
  int64_t tuple(std::vector<int64_t> items);
  int64_t list(std::vector<int64_t> items);
  int64_t dict(std::vector<int64_t> key_values = {});  // k0, v0, k1, v1, ...
  void set(int64_t dict, const std::string& key, int64_t value);
  int64_t global(const std::string& module, const std::string& name);
  // callee(*args), or with `newobj` cls.__new__(cls, *args); `state` (-1: none) is BUILD's.
  int64_t call(int64_t callee, std::vector<int64_t> args, int64_t state = -1, bool newobj = false);
  int64_t persistent_id(int64_t tuple);
  int64_t add(Node n);
};

// Protocol 2 bytes of the tree rooted at `root` (shared subtrees are written again; the tree
// must be acyclic, as Builder's are).
std::string serialize(const Pickle& pk, int64_t root);

}  // namespace mt::checkpoint::pickle
