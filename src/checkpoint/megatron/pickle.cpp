// The restricted unpickler (pickle.h): a stack machine over node indices, for the opcodes that
// torch.save (protocol 2) and PyTorch's distributed checkpoint metadata (protocol 4) emit.
#include "checkpoint/megatron/pickle.h"

#include <cstring>
#include <set>
#include <utility>

#include "core/error.h"

namespace mt::checkpoint::pickle {

namespace {

// The classes and functions Megatron-LM checkpoints name. None is ever called: each becomes an
// inert Global node, so the list says what the readers know how to interpret.
const std::set<std::pair<std::string, std::string>>& allow_list() {
  static const std::set<std::pair<std::string, std::string>> s = {
      {"collections", "OrderedDict"},
      {"torch._utils", "_rebuild_tensor_v2"},
      {"torch", "FloatStorage"}, {"torch", "BFloat16Storage"}, {"torch", "HalfStorage"},
      {"torch", "DoubleStorage"}, {"torch", "LongStorage"}, {"torch", "IntStorage"},
      {"torch", "ShortStorage"}, {"torch", "CharStorage"}, {"torch", "ByteStorage"},
      {"torch", "BoolStorage"}, {"torch.storage", "UntypedStorage"},
      {"torch", "Size"}, {"torch", "device"},
      {"torch", "float32"}, {"torch", "bfloat16"}, {"torch", "float16"}, {"torch", "float64"},
      {"torch", "int64"}, {"torch", "int32"}, {"torch", "int16"}, {"torch", "int8"}, {"torch", "uint8"},
      {"torch", "bool"},
      {"torch.serialization", "_get_layout"},
      {"argparse", "Namespace"},
      // PyTorch distributed checkpoint metadata (torch/distributed/checkpoint/metadata.py).
      {"torch.distributed.checkpoint.metadata", "Metadata"},
      {"torch.distributed.checkpoint.metadata", "TensorStorageMetadata"},
      {"torch.distributed.checkpoint.metadata", "BytesStorageMetadata"},
      {"torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"},
      {"torch.distributed.checkpoint.metadata", "TensorProperties"},
      {"torch.distributed.checkpoint.metadata", "MetadataIndex"},
      {"torch.distributed.checkpoint.metadata", "StorageMeta"},
      {"torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"},
      {"torch.distributed.checkpoint.filesystem", "_StorageInfo"},
      // Enums inside Megatron's saved args and rerun state (recorded, never interpreted).
      {"megatron.core.transformer.enums", "AttnBackend"},
      {"megatron.core.transformer.enums", "AttnMaskType"},
      {"megatron.core.transformer.enums", "InferenceCudaGraphScope"},
      {"megatron.core.transformer.enums", "CudaGraphScope"},
      {"megatron.core.enums", "ModelType"},
      {"megatron.core.rerun_state_machine", "RerunMode"},
      {"megatron.core.rerun_state_machine", "RerunState"},
      {"megatron.core.rerun_state_machine", "RerunDiagnostic"},
      {"signal", "Signals"},
      // The numpy RNG state (an ndarray of MT19937 words) in Megatron's rng_state.
      {"numpy", "dtype"}, {"numpy", "ndarray"},
      {"numpy.core.multiarray", "_reconstruct"}, {"numpy._core.multiarray", "_reconstruct"},
      {"_codecs", "encode"},
  };
  return s;
}

class Parser {
 public:
  Parser(const uint8_t* d, size_t n, const std::string& where, const Limits& lim)
      : d_(d), n_(n), where_(where), lim_(lim) {}

  Pickle run() {
    for (;;) {
      const size_t at = pos_;
      const uint8_t op = u8();
      if (op == '.') break;
      step(op, at);
    }
    if (stack_.size() != 1 || !marks_.empty()) bad("STOP with {} values on the stack", stack_.size());
    out_.root = stack_.back();
    check_tree();
    return std::move(out_);
  }

 private:
  template <typename... A>
  [[noreturn]] void bad(fmt::format_string<A...> f, A&&... a) {
    fail("'{}' is not a checkpoint pickle megatron.cpp reads: {} (at byte {})", where_,
         fmt::format(f, std::forward<A>(a)...), pos_);
  }

  void need(size_t k) {
    if (k > n_ - pos_) bad("truncated: {} more bytes needed, {} left", k, n_ - pos_);
  }
  uint8_t u8() {
    need(1);
    return d_[pos_++];
  }
  uint64_t le(size_t k) {
    need(k);
    uint64_t v = 0;
    for (size_t i = 0; i < k; ++i) v |= static_cast<uint64_t>(d_[pos_ + i]) << (8 * i);
    pos_ += k;
    return v;
  }
  std::string bytes(uint64_t k) {
    if (k > n_ - pos_) bad("a length of {} bytes reaches past the end ({} left)", k, n_ - pos_);
    std::string s(reinterpret_cast<const char*>(d_ + pos_), static_cast<size_t>(k));
    pos_ += static_cast<size_t>(k);
    return s;
  }
  std::string line() {
    const void* nl = std::memchr(d_ + pos_, '\n', n_ - pos_);
    if (!nl) bad("GLOBAL without a newline");
    const size_t k = static_cast<const uint8_t*>(nl) - (d_ + pos_);
    std::string s = bytes(k);
    ++pos_;
    return s;
  }

  int64_t add(Node n) {
    if (static_cast<int64_t>(out_.nodes.size()) >= lim_.max_nodes) bad("more than {} values", lim_.max_nodes);
    out_.nodes.push_back(std::move(n));
    return static_cast<int64_t>(out_.nodes.size()) - 1;
  }
  void push(int64_t i) { stack_.push_back(i); }
  void push_new(Node n) { push(add(std::move(n))); }
  int64_t pop() {
    if (stack_.size() <= floor()) bad("stack underflow");
    const int64_t v = stack_.back();
    stack_.pop_back();
    return v;
  }
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  // The values above the topmost mark, which is removed.
  std::vector<int64_t> pop_mark() {
    if (marks_.empty()) bad("no MARK to pop to");
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<int64_t> v(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return v;
  }
  Node& node(int64_t i) { return out_.nodes[static_cast<size_t>(i)]; }
  Node& expect(int64_t i, Kind k, const char* what) {
    if (node(i).kind != k) bad("{} applied to a value of another kind", what);
    return node(i);
  }
  void memo_put(uint64_t idx) {
    if (stack_.size() <= floor()) bad("memo store with an empty stack");
    if (idx >= static_cast<uint64_t>(lim_.max_memo)) bad("memo index {} past the limit of {}", idx, lim_.max_memo);
    if (idx >= memo_.size()) memo_.resize(idx + 1, -1);
    memo_[idx] = stack_.back();
  }
  void memo_get(uint64_t idx) {
    if (idx >= memo_.size() || memo_[idx] < 0) bad("memo index {} was never stored", idx);
    push(memo_[idx]);
  }
  Node tuple(std::vector<int64_t> items) {
    Node t;
    t.kind = Kind::Tuple;
    t.items = std::move(items);
    return t;
  }
  void global(const std::string& module, const std::string& name) {
    if (!allowed_global(module, name))
      bad("it names {}.{}, which is not on the allow-list of classes these checkpoints use (refused: loading a "
          "pickle must never run code)",
          module, name);
    Node g;
    g.kind = Kind::Global;
    g.s = module;
    g.name = name;
    push_new(std::move(g));
  }
  void call(int64_t callee, int64_t args, bool newobj) {
    if (node(callee).kind != Kind::Global) bad("a call of something other than an allowed class");
    if (node(args).kind != Kind::Tuple) bad("call arguments that are not a tuple");
    // OrderedDict() is a dict the following SETITEMS fill.
    if (node(callee).s == "collections" && node(callee).name == "OrderedDict" && node(args).items.empty()) {
      Node d;
      d.kind = Kind::Dict;
      push_new(std::move(d));
      return;
    }
    Node c;
    c.kind = Kind::Call;
    c.items = {callee, args, -1};
    c.b = newobj;
    push_new(std::move(c));
  }

  void step(uint8_t op, size_t at) {
    switch (op) {
      case 0x80: u8(); break;       // PROTO
      case 0x95: le(8); break;      // FRAME: a hint of the next frame's length
      case '(': marks_.push_back(stack_.size()); break;  // MARK
      case '0': pop(); break;       // POP
      case '1': pop_mark(); break;  // POP_MARK
      case 'N': push_new(Node{}); break;
      case 0x88: case 0x89: {  // NEWTRUE, NEWFALSE
        Node b;
        b.kind = Kind::Bool;
        b.b = op == 0x88;
        push_new(std::move(b));
        break;
      }
      case 'J': case 'K': case 'M': {  // BININT (signed 4), BININT1, BININT2
        Node v;
        v.kind = Kind::Int;
        v.i = op == 'J' ? static_cast<int32_t>(le(4)) : static_cast<int64_t>(le(op == 'K' ? 1 : 2));
        push_new(std::move(v));
        break;
      }
      case 0x8a: {  // LONG1: little-endian two's complement
        const uint8_t k = u8();
        if (k > 8) bad("an integer of {} bytes (more than 64 bits)", k);
        uint64_t u = le(k);
        if (k > 0 && k < 8 && (u >> (8 * k - 1)) & 1) u |= ~uint64_t{0} << (8 * k);  // sign-extend
        Node v;
        v.kind = Kind::Int;
        v.i = static_cast<int64_t>(u);
        push_new(std::move(v));
        break;
      }
      case 'G': {  // BINFLOAT: big-endian double
        need(8);
        uint64_t u = 0;
        for (int i = 0; i < 8; ++i) u = (u << 8) | d_[pos_ + i];
        pos_ += 8;
        Node v;
        v.kind = Kind::Float;
        std::memcpy(&v.f, &u, 8);
        push_new(std::move(v));
        break;
      }
      case 'X': case 0x8c: case 0x8d: case 'B': case 'C': {  // (SHORT_)BINUNICODE(8), (SHORT_)BINBYTES
        const size_t w = op == 'X' || op == 'B' ? 4 : op == 0x8d ? 8 : 1;
        Node v;
        v.kind = op == 'B' || op == 'C' ? Kind::Bytes : Kind::Str;
        v.s = bytes(le(w));
        push_new(std::move(v));
        break;
      }
      case ')': push_new(tuple({})); break;
      case 't': push_new(tuple(pop_mark())); break;
      case 0x85: case 0x86: case 0x87: {  // TUPLE1..3
        std::vector<int64_t> v(static_cast<size_t>(op - 0x84));
        for (size_t i = v.size(); i-- > 0;) v[i] = pop();
        push_new(tuple(std::move(v)));
        break;
      }
      case ']': case 'l': {  // EMPTY_LIST, LIST
        Node l;
        l.kind = Kind::List;
        if (op == 'l') l.items = pop_mark();
        push_new(std::move(l));
        break;
      }
      case 'a': {  // APPEND
        const int64_t v = pop();
        expect(top(), Kind::List, "APPEND").items.push_back(v);
        break;
      }
      case 'e': {  // APPENDS
        std::vector<int64_t> v = pop_mark();
        auto& l = expect(top(), Kind::List, "APPENDS").items;
        l.insert(l.end(), v.begin(), v.end());
        break;
      }
      case '}': case 'd': {  // EMPTY_DICT, DICT
        Node m;
        m.kind = Kind::Dict;
        if (op == 'd') m.items = pop_mark();
        if (m.items.size() % 2) bad("DICT with an odd number of values");
        push_new(std::move(m));
        break;
      }
      case 's': {  // SETITEM
        const int64_t v = pop(), k = pop();
        auto& m = expect(top(), Kind::Dict, "SETITEM").items;
        m.push_back(k);
        m.push_back(v);
        break;
      }
      case 'u': {  // SETITEMS
        std::vector<int64_t> v = pop_mark();
        if (v.size() % 2) bad("SETITEMS with an odd number of values");
        auto& m = expect(top(), Kind::Dict, "SETITEMS").items;
        m.insert(m.end(), v.begin(), v.end());
        break;
      }
      case 'c': {  // GLOBAL module\nname\n
        std::string module = line();
        std::string name = line();
        global(module, name);
        break;
      }
      case 0x93: {  // STACK_GLOBAL
        const int64_t name = pop(), module = pop();
        if (node(name).kind != Kind::Str || node(module).kind != Kind::Str) bad("STACK_GLOBAL of non-strings");
        global(node(module).s, node(name).s);
        break;
      }
      case 'R': {  // REDUCE callee(*args)
        const int64_t args = pop(), callee = pop();
        call(callee, args, false);
        break;
      }
      case 0x81: {  // NEWOBJ cls.__new__(cls, *args)
        const int64_t args = pop(), cls = pop();
        call(cls, args, true);
        break;
      }
      case 'b': {  // BUILD: obj.__setstate__(state), recorded
        const int64_t state = pop();
        // A state dict's OrderedDict carries attributes (its _metadata of module versions),
        // which nothing here reads: dropped.
        if (node(top()).kind == Kind::Dict) break;
        Node& c = expect(top(), Kind::Call, "BUILD");
        if (c.items[2] >= 0) bad("BUILD applied twice to one object");
        c.items[2] = state;
        break;
      }
      case 'Q': {  // BINPERSID
        Node p;
        p.kind = Kind::PersId;
        p.items = {pop()};
        push_new(std::move(p));
        break;
      }
      case 'q': memo_put(le(1)); break;  // BINPUT
      case 'r': memo_put(le(4)); break;  // LONG_BINPUT
      case 0x94: memo_put(memo_count_++); break;  // MEMOIZE
      case 'h': memo_get(le(1)); break;  // BINGET
      case 'j': memo_get(le(4)); break;  // LONG_BINGET
      default:
        pos_ = at;
        bad("opcode 0x{:02x} is not one these checkpoints use", op);
    }
  }
  int64_t top() {
    if (stack_.size() <= floor()) bad("stack underflow");
    return stack_.back();
  }

  // Refuses cycles and nesting past the limit, so readers may recurse over the tree. Every node
  // is expanded once (shared subtrees are not walked again), so this is linear in the tree.
  void check_tree() {
    std::vector<uint8_t> state(out_.nodes.size(), 0);  // 0 new, 1 on the path, 2 done
    visit(out_.root, 0, state);
  }
  void visit(int64_t i, int64_t depth, std::vector<uint8_t>& state) {
    uint8_t& s = state[static_cast<size_t>(i)];
    if (s == 2) return;
    if (s == 1) bad("a recursive structure (a value that contains itself)");
    if (depth > lim_.max_depth) bad("values nested more than {} deep", lim_.max_depth);
    s = 1;
    for (int64_t c : out_.nodes[static_cast<size_t>(i)].items)
      if (c >= 0) visit(c, depth + 1, state);
    state[static_cast<size_t>(i)] = 2;
  }

  const uint8_t* d_;
  size_t n_;
  size_t pos_ = 0;
  std::string where_;
  Limits lim_;
  Pickle out_;
  std::vector<int64_t> stack_;
  std::vector<size_t> marks_;
  std::vector<int64_t> memo_;
  uint64_t memo_count_ = 0;
};

}  // namespace

bool allowed_global(const std::string& module, const std::string& name) {
  return allow_list().count({module, name}) != 0;
}

int64_t Pickle::get(int64_t dict, const std::string& key) const {
  const Node& d = at(dict);
  if (d.kind != Kind::Dict) return -1;
  for (size_t k = 0; k + 1 < d.items.size(); k += 2) {
    const Node& n = at(d.items[k]);
    if (n.kind == Kind::Str && n.s == key) return d.items[k + 1];
  }
  return -1;
}

std::string Pickle::callee(int64_t call) const {
  const Node& c = at(call);
  if (c.kind != Kind::Call) return "";
  const Node& g = at(c.items[0]);
  return g.s + "." + g.name;
}

Pickle parse(const uint8_t* data, size_t size, const std::string& where, const Limits& lim) {
  return Parser(data, size, where, lim).run();
}

}  // namespace mt::checkpoint::pickle
