// data.pkl of a checkpoint archive, walked opcode by opcode before LibTorch's unpickler sees it.
// LibTorch's unpickler resolves every GLOBAL (a class name goes to its type parser and compiler),
// trusts length and memo fields, and rebuilds tensors over storages without checking that they
// fit. So this reader takes only what LibTorch's pickler writes for modules of values: the
// opcodes it uses, the GLOBALs of the archive's classes, tensors and storages, every length
// checked against the bytes left, every object's attributes against its class, every tensor
// against its storage; anything else is refused with the byte where it was found.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "archive_screen.h"
#include "pickle_bytes.h"

namespace ampactor::internal {

namespace {

struct Node {
  // Object and the kinds before it are values an attribute may hold.
  // clang-format off
  enum Kind { None, Bool, Int, Float, Str, Tuple, Tensor, Object, Dict, ClassRef, NewObject,
              StorageType, Storage, Rebuild, OrderedDict, Hooks };
  // clang-format on
  Node(Kind k, std::int64_t i = 0, std::string s = {}) : kind(k), i(i), s(std::move(s)) {}
  Kind kind;
  std::int64_t i;                  // Int; Bool; Storage: elements; StorageType: element size
  std::string s;                   // Str; ClassRef, NewObject, Object: class; Storage: key
  std::vector<std::size_t> items;  // Tuple; Dict: key, value, key, value...
};

/// The storage classes LibTorch's unpickler knows, and their element sizes.
int element_size(const std::string& name) {
  static const std::pair<const char*, int> types[] = {
      {"ByteStorage", 1},   {"CharStorage", 1},         {"BoolStorage", 1},
      {"ShortStorage", 2},  {"HalfStorage", 2},         {"BFloat16Storage", 2},
      {"IntStorage", 4},    {"FloatStorage", 4},        {"LongStorage", 8},
      {"DoubleStorage", 8}, {"ComplexFloatStorage", 8}, {"ComplexDoubleStorage", 16}};
  for (const auto& [n, size] : types)
    if (name == n) return size;
  return 0;
}

bool is_device(const std::string& s) {
  if (s == "cpu" || s == "cuda") return true;
  if (s.compare(0, 5, "cuda:") != 0 || s.size() == 5 || s.size() > 8) return false;
  for (std::size_t i = 5; i < s.size(); ++i)
    if (s[i] < '0' || s[i] > '9') return false;
  return true;
}

class Screen : PickleBytes<ArchiveProblem> {
 public:
  Screen(const char* data, std::size_t size, const ClassTable& classes,
         const StorageTable& storages, std::set<std::string>& used)
      : PickleBytes(data, size, "data.pkl: "),
        classes_(classes),
        storages_(storages),
        used_(used) {}

  void run() {
    if (size_ < 2 || p_[0] != '\x80' || p_[1] != 2) fail(0, "not LibTorch's pickle protocol 2");
    pos_ = 2;
    while (true) {
      const std::size_t at = pos_;
      const auto op = static_cast<unsigned char>(*bytes(1));
      if (op == '.') {  // STOP
        stop(at);
        return;
      }
      // The groups take disjoint opcodes: which is asked first changes nothing.
      if (!memo_op(at, op) && !build_op(at, op) && !value_op(at, op)) unknown_op(at, op);
    }
  }

 private:
  /// The opcodes that name a class, mark the stack or share a value through the memo. False if
  /// `op` is none of them.
  bool memo_op(std::size_t at, unsigned char op) {
    switch (op) {
      case 'c':  // GLOBAL
        global(at);
        return true;
      case 'q':  // BINPUT
        memoize(at, unsigned_le(1));
        return true;
      case 'r':  // LONG_BINPUT
        memoize(at, unsigned_le(4));
        return true;
      case 'h':  // BINGET
        recall(at, unsigned_le(1));
        return true;
      case 'j':  // LONG_BINGET
        recall(at, unsigned_le(4));
        return true;
      case '(':  // MARK
        marks_.push_back(stack_.size());
        return true;
    }
    return false;
  }
  /// The opcodes that build tuples, dicts, objects and tensors. False if `op` is none of them.
  bool build_op(std::size_t at, unsigned char op) {
    switch (op) {
      case ')':  // EMPTY_TUPLE
        push({Node::Tuple});
        return true;
      case 't':  // TUPLE
        tuple(at, stack_.size() - mark(at));
        return true;
      case 0x85:  // TUPLE1..3
      case 0x86:
      case 0x87:
        tuple(at, op - 0x84);
        return true;
      case '}':  // EMPTY_DICT
        push({Node::Dict});
        return true;
      case 's':  // SETITEM
        setitems(at, stack_.size() - 2);
        return true;
      case 'u':  // SETITEMS
        setitems(at, mark(at));
        return true;
      case 0x81:  // NEWOBJ
        newobj(at);
        return true;
      case 'b':  // BUILD
        build(at);
        return true;
      case 'R':  // REDUCE
        reduce(at);
        return true;
      case 'Q':  // BINPERSID
        persistent(at);
        return true;
    }
    return false;
  }
  /// The opcodes that push a plain value. False if `op` is none of them.
  bool value_op(std::size_t at, unsigned char op) {
    switch (op) {
      case 'N':  // NONE
        push({Node::None});
        return true;
      case 0x88:  // NEWTRUE
        push({Node::Bool, 1});
        return true;
      case 0x89:  // NEWFALSE
        push({Node::Bool, 0});
        return true;
      case 'K':  // BININT1
        push({Node::Int, std::int64_t(unsigned_le(1))});
        return true;
      case 'M':  // BININT2
        push({Node::Int, std::int64_t(unsigned_le(2))});
        return true;
      case 'J':  // BININT
        push({Node::Int, std::int32_t(unsigned_le(4))});
        return true;
      case 0x8a:  // LONG1: LibTorch reads 8 bytes, no other length
        if (unsigned_le(1) != 8) fail(at, "an int that is not 8 bytes long");
        push({Node::Int, std::int64_t(unsigned_le(8))});
        return true;
      case 'G':  // BINFLOAT
        bytes(8), push({Node::Float});
        return true;
      case 'X': {  // BINUNICODE
        const std::uint64_t n = unsigned_le(4);
        push({Node::Str, 0, std::string(bytes(n), n)});
        return true;
      }
    }
    return false;
  }
  void stop(std::size_t at) {
    if (!marks_.empty() || stack_.size() != 1 || nodes_[stack_[0]].kind != Node::Object)
      fail(at, "the pickle does not end with one module");
    if (pos_ != size_) fail(pos_, "bytes after the pickle's end");
  }
  [[noreturn]] void unknown_op(std::size_t at, unsigned char op) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", op);
    fail(at, std::string("pickle opcode ") + hex + ", which ampactor's checkpoints never hold");
  }
  std::string line(std::size_t at) {
    const void* nl = std::memchr(p_ + pos_, '\n', std::min<std::size_t>(size_ - pos_, 256));
    if (!nl) fail(at, "a GLOBAL without its end of line");
    const std::size_t n = static_cast<const char*>(nl) - (p_ + pos_);
    std::string s(bytes(n + 1), n);
    return s;
  }
  void push(Node n) {
    nodes_.push_back(std::move(n));
    stack_.push_back(nodes_.size() - 1);
  }
  /// The top of the stack, never below the last mark.
  const Node& top(std::size_t at, std::size_t depth = 0) {
    const std::size_t floor = marks_.empty() ? 0 : marks_.back();
    if (stack_.size() - floor <= depth) fail(at, "an opcode with nothing to take");
    return nodes_[stack_[stack_.size() - 1 - depth]];
  }
  std::size_t mark(std::size_t at) {
    if (marks_.empty()) fail(at, "an opcode that needs a mark without one");
    const std::size_t m = marks_.back();
    marks_.pop_back();
    return m;
  }
  static bool is_value(const Node& n) { return n.kind <= Node::Object; }

  void global(std::size_t at) {
    const std::string module = line(at), name = line(at);
    Node n{Node::ClassRef, 0, module + "." + name};
    if (name == "Module" && classes_.count(n.s)) {
      // one of the archive's classes (their names are all "__torch__[.___torch_mangle_N].Module")
    } else if (module == "torch._utils" && name == "_rebuild_tensor_v2") {
      n.kind = Node::Rebuild;
    } else if (module == "collections" && name == "OrderedDict") {
      n.kind = Node::OrderedDict;  // a tensor's backward hooks, always empty
    } else if (module == "torch" && (n.i = element_size(name)) != 0) {
      n.kind = Node::StorageType;
    } else {
      fail(at, "GLOBAL '" + shown(n.s) + "', which ampactor's checkpoints never name");
    }
    push(std::move(n));
  }
  // LibTorch's memo is a list, appended to whatever BINPUT's index says: so the index must be
  // the next one, and it keeps nothing that changes later (a dict being filled, an object not yet
  // built).
  void memoize(std::size_t at, std::uint64_t index) {
    const Node& n = top(at);
    if (index != memo_.size()) fail(at, "a memo index out of order");
    if (n.kind == Node::Dict || n.kind == Node::NewObject) fail(at, "a memo of a mutable value");
    memo_.push_back(stack_.back());
  }
  void recall(std::size_t at, std::uint64_t index) {
    if (index >= memo_.size()) fail(at, "a memo index never set");
    stack_.push_back(memo_[index]);
  }
  void tuple(std::size_t at, std::size_t n) {
    if (n > 0) top(at, n - 1);
    Node t{Node::Tuple};
    for (std::size_t i = stack_.size() - n; i < stack_.size(); ++i) {
      const Node::Kind k = nodes_[stack_[i]].kind;
      if (k == Node::Dict || k == Node::NewObject) fail(at, "a tuple of a mutable value");
      t.items.push_back(stack_[i]);
    }
    stack_.resize(stack_.size() - n);
    push(std::move(t));
  }
  void setitems(std::size_t at, std::size_t first) {
    if (first < 1 || first > stack_.size() || (stack_.size() - first) % 2 != 0 ||
        nodes_[stack_[first - 1]].kind != Node::Dict || (!marks_.empty() && marks_.back() >= first))
      fail(at, "items set on something that is not a dict");
    Node& dict = nodes_[stack_[first - 1]];
    for (std::size_t i = first; i < stack_.size(); i += 2) {
      if (nodes_[stack_[i]].kind != Node::Str) fail(at, "a dict key that is not a str");
      if (!is_value(nodes_[stack_[i + 1]])) fail(at, "a dict value of a kind modules never hold");
      dict.items.push_back(stack_[i]), dict.items.push_back(stack_[i + 1]);
    }
    stack_.resize(first);
  }
  void newobj(std::size_t at) {
    const Node& args = top(at);
    const Node& cls = top(at, 1);
    if (args.kind != Node::Tuple || !args.items.empty() || cls.kind != Node::ClassRef)
      fail(at, "NEWOBJ of something that is not a module class");
    Node obj{Node::NewObject, 0, cls.s};
    stack_.resize(stack_.size() - 2);
    push(std::move(obj));
  }
  // An object's state: its class's attributes, in its class's order, each of its declared type.
  void build(std::size_t at) {
    const Node& state = top(at);
    const Node& obj = top(at, 1);
    if (state.kind != Node::Dict || obj.kind != Node::NewObject)
      fail(at, "BUILD of something that is not a new module");
    const ClassDef& c = classes_.at(obj.s);
    const std::string what = "a " + obj.s;
    if (state.items.size() != 2 * c.names.size())
      fail(at, what + " with " + std::to_string(state.items.size() / 2) + " attributes, not " +
                   std::to_string(c.names.size()));
    for (std::size_t i = 0; i < c.names.size(); ++i) {
      const std::string& key = nodes_[state.items[2 * i]].s;
      if (key != c.names[i]) fail(at, what + " with '" + shown(key) + "' for '" + c.names[i] + "'");
      if (!matches(state.items[2 * i + 1], c.types[i]))
        fail(at, what + "'s '" + c.names[i] + "' is not its declared " + type_str(c.types[i]));
    }
    Node built{Node::Object, 0, obj.s};
    stack_.resize(stack_.size() - 2);
    push(std::move(built));
  }
  bool matches(std::size_t id, const TypeExpr& t) const {
    const Node& n = nodes_[id];
    switch (t.kind) {
      case TypeExpr::Int:
        return n.kind == Node::Int;
      case TypeExpr::Float:
        return n.kind == Node::Float;
      case TypeExpr::Bool:
        return n.kind == Node::Bool;
      case TypeExpr::Str:
        return n.kind == Node::Str;
      case TypeExpr::None:
        return n.kind == Node::None;
      case TypeExpr::Tensor:
        return n.kind == Node::Tensor;  // LibTorch cannot write an undefined one
      case TypeExpr::Class:
        return n.kind == Node::Object && n.s == t.name;
      case TypeExpr::Tuple:
        if (n.kind != Node::Tuple || n.items.size() != t.items.size()) return false;
        for (std::size_t i = 0; i < t.items.size(); ++i)
          if (!matches(n.items[i], t.items[i])) return false;
        return true;
    }
    return false;
  }
  // ('storage', <dtype>Storage, key, location, elements): the record data/<key>, read whole.
  void persistent(std::size_t at) {
    const Node& t = top(at);
    const auto item = [&](std::size_t i) -> const Node& { return nodes_[t.items[i]]; };
    if (t.kind != Node::Tuple || t.items.size() != 5 || item(0).kind != Node::Str ||
        item(0).s != "storage" || item(1).kind != Node::StorageType || item(2).kind != Node::Str ||
        item(3).kind != Node::Str || item(4).kind != Node::Int)
      fail(at, "a persistent id that is not a tensor storage");
    const std::string& key = item(2).s;
    const std::int64_t n = item(4).i, element = item(1).i;
    const auto record = storages_.find(key);
    if (record == storages_.end()) fail(at, "a storage whose record is missing");
    if (n < 0 || std::uint64_t(n) > record->second / element ||
        std::uint64_t(n) * element != record->second)
      fail(at, "storage " + shown(key) + " of another size than its record");
    if (!is_device(item(3).s)) fail(at, "a storage on device '" + shown(item(3).s) + "'");
    if (!element_of_.emplace(key, element).second && element_of_[key] != element)
      fail(at, "storage " + shown(key) + " read as two types");
    used_.insert(key);
    Node s{Node::Storage, n, key};
    stack_.pop_back();
    push(std::move(s));
  }
  void reduce(std::size_t at) {
    const Node& args = top(at);
    const Node& f = top(at, 1);
    if (args.kind != Node::Tuple) fail(at, "REDUCE without a tuple of arguments");
    Node out{Node::Hooks};
    if (f.kind == Node::OrderedDict) {
      if (!args.items.empty()) fail(at, "backward hooks that are not empty");
    } else if (f.kind == Node::Rebuild) {
      rebuild_tensor(at, args);
      out.kind = Node::Tensor;
    } else {
      fail(at, "REDUCE of something that is not a tensor");
    }
    stack_.resize(stack_.size() - 2);
    push(std::move(out));
  }
  // (storage, offset, sizes, strides, requires_grad, hooks): LibTorch sets these on the tensor
  // as they are, so every element the tensor can reach must lie in its storage.
  void rebuild_tensor(std::size_t at, const Node& args) {
    const auto item = [&](std::size_t i) -> const Node& { return nodes_[args.items[i]]; };
    if (args.items.size() != 6 || item(0).kind != Node::Storage || item(1).kind != Node::Int ||
        item(2).kind != Node::Tuple || item(3).kind != Node::Tuple || item(4).kind != Node::Bool ||
        item(5).kind != Node::Hooks || item(2).items.size() != item(3).items.size() ||
        item(2).items.size() > 64)
      fail(at, "a tensor that is not rebuilt as LibTorch writes tensors");
    std::int64_t last = item(1).i, count = 1;  // the furthest element, the elements
    bool empty = false, overflow = last < 0;
    for (std::size_t d = 0; d < item(2).items.size(); ++d) {
      const Node& size = nodes_[item(2).items[d]];
      const Node& stride = nodes_[item(3).items[d]];
      if (size.kind != Node::Int || stride.kind != Node::Int || size.i < 0 || stride.i < 0)
        fail(at, "a tensor size or stride that is not a natural number");
      std::int64_t reach = 0;
      empty |= size.i == 0;
      overflow |= __builtin_mul_overflow(size.i, count, &count) ||
                  (size.i > 0 && (__builtin_mul_overflow(size.i - 1, stride.i, &reach) ||
                                  __builtin_add_overflow(last, reach, &last)));
    }
    if (overflow || (!empty && last >= item(0).i) || item(1).i > item(0).i)
      fail(at, "a tensor that reaches past its storage");
  }

  const ClassTable& classes_;
  const StorageTable& storages_;
  std::set<std::string>& used_;
  std::map<std::string, std::int64_t> element_of_;
  std::vector<Node> nodes_;
  std::vector<std::size_t> stack_, marks_, memo_;
};

}  // namespace

void screen_data_pickle(const char* data, std::size_t size, const ClassTable& classes,
                        const StorageTable& storages, std::set<std::string>& used) {
  Screen(data, size, classes, storages, used).run();
}

}  // namespace ampactor::internal
