// Writing pickles (pickle.h's Builder and serialize): the few opcodes Python's protocol 2 needs
// for the values Megatron-LM checkpoints hold. No memo: every value is written where it is used.
#include <cstring>

#include "checkpoint/megatron/pickle.h"
#include "core/error.h"

namespace mt::checkpoint::pickle {

int64_t Builder::add(Node n) {
  pk.nodes.push_back(std::move(n));
  return static_cast<int64_t>(pk.nodes.size()) - 1;
}
int64_t Builder::none() { return add(Node{}); }
int64_t Builder::boolean(bool v) {
  Node n;
  n.kind = Kind::Bool;
  n.b = v;
  return add(std::move(n));
}
int64_t Builder::integer(int64_t v) {
  Node n;
  n.kind = Kind::Int;
  n.i = v;
  return add(std::move(n));
}
int64_t Builder::real(double v) {
  Node n;
  n.kind = Kind::Float;
  n.f = v;
  return add(std::move(n));
}
int64_t Builder::str(const std::string& v) {
  Node n;
  n.kind = Kind::Str;
  n.s = v;
  return add(std::move(n));
}
int64_t Builder::tuple(std::vector<int64_t> items) {
  Node n;
  n.kind = Kind::Tuple;
  n.items = std::move(items);
  return add(std::move(n));
}
int64_t Builder::list(std::vector<int64_t> items) {
  Node n;
  n.kind = Kind::List;
  n.items = std::move(items);
  return add(std::move(n));
}
int64_t Builder::dict(std::vector<int64_t> kv) {
  MT_CHECK(kv.size() % 2 == 0, "dict of {} keys and values", kv.size());
  Node n;
  n.kind = Kind::Dict;
  n.items = std::move(kv);
  return add(std::move(n));
}
void Builder::set(int64_t dict, const std::string& key, int64_t value) {
  const int64_t k = str(key);
  pk.nodes[static_cast<size_t>(dict)].items.push_back(k);
  pk.nodes[static_cast<size_t>(dict)].items.push_back(value);
}
int64_t Builder::global(const std::string& module, const std::string& name) {
  MT_CHECK(allowed_global(module, name), "writing {}.{}", module, name);
  Node n;
  n.kind = Kind::Global;
  n.s = module;
  n.name = name;
  return add(std::move(n));
}
int64_t Builder::call(int64_t callee, std::vector<int64_t> args, int64_t state, bool newobj) {
  const int64_t a = tuple(std::move(args));
  Node n;
  n.kind = Kind::Call;
  n.items = {callee, a, state};
  n.b = newobj;
  return add(std::move(n));
}
int64_t Builder::persistent_id(int64_t t) {
  Node n;
  n.kind = Kind::PersId;
  n.items = {t};
  return add(std::move(n));
}

namespace {

void put_le(std::string& out, uint64_t v, int k) {
  for (int i = 0; i < k; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

void emit(const Pickle& pk, int64_t i, std::string& out, int depth) {
  MT_CHECK(depth < 1000, "pickle tree too deep to write");
  const Node& n = pk.at(i);
  switch (n.kind) {
    case Kind::None: out.push_back('N'); break;
    case Kind::Bool: out.push_back(n.b ? '\x88' : '\x89'); break;
    case Kind::Int:
      if (n.i >= 0 && n.i < 256) {
        out.push_back('K');
        put_le(out, static_cast<uint64_t>(n.i), 1);
      } else if (n.i >= INT32_MIN && n.i <= INT32_MAX) {
        out.push_back('J');
        put_le(out, static_cast<uint64_t>(static_cast<uint32_t>(static_cast<int32_t>(n.i))), 4);
      } else {
        out.push_back('\x8a');
        out.push_back('\x08');
        put_le(out, static_cast<uint64_t>(n.i), 8);
      }
      break;
    case Kind::Float: {
      uint64_t u;
      std::memcpy(&u, &n.f, 8);
      out.push_back('G');
      for (int k = 7; k >= 0; --k) out.push_back(static_cast<char>(u >> (8 * k)));
      break;
    }
    case Kind::Str:
    case Kind::Bytes:
      MT_CHECK(n.s.size() < (uint64_t{1} << 32), "string of {} bytes", n.s.size());
      out.push_back(n.kind == Kind::Str ? 'X' : 'B');
      put_le(out, n.s.size(), 4);
      out += n.s;
      break;
    case Kind::Tuple:
      if (n.items.empty()) {
        out.push_back(')');
        break;
      }
      out.push_back('(');
      for (int64_t c : n.items) emit(pk, c, out, depth + 1);
      out.push_back('t');
      break;
    case Kind::List:
    case Kind::Dict:
      out.push_back(n.kind == Kind::List ? ']' : '}');
      if (n.items.empty()) break;
      out.push_back('(');
      for (int64_t c : n.items) emit(pk, c, out, depth + 1);
      out.push_back(n.kind == Kind::List ? 'e' : 'u');
      break;
    case Kind::Global:
      out += "c" + n.s + "\n" + n.name + "\n";
      break;
    case Kind::Call:
      emit(pk, n.items[0], out, depth + 1);
      emit(pk, n.items[1], out, depth + 1);
      out.push_back(n.b ? '\x81' : 'R');
      if (n.items[2] >= 0) {
        emit(pk, n.items[2], out, depth + 1);
        out.push_back('b');
      }
      break;
    case Kind::PersId:
      emit(pk, n.items[0], out, depth + 1);
      out.push_back('Q');
      break;
  }
}

}  // namespace

std::string serialize(const Pickle& pk, int64_t root) {
  std::string out = "\x80\x02";
  emit(pk, root, out, 0);
  out.push_back('.');
  return out;
}

}  // namespace mt::checkpoint::pickle
