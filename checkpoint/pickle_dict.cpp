#include "pickle_dict.h"

#include "pickle_bytes.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <variant>
#include <vector>

namespace ampactor::internal {

namespace {

struct Mark {};
struct Dict {};
struct Bool {
  bool v;
};
using Item = std::variant<Mark, Dict, std::string, double, std::int64_t, Bool>;

const char* kind(const Item& i) {
  static const char* names[] = {"mark", "dict", "str", "float", "int", "bool"};
  return names[i.index()];
}

class Reader : PickleBytes<PickleProblem> {
 public:
  Reader(const char* data, std::size_t size) : PickleBytes(data, size, "") {}

  StateDict run() {
    StateDict dict;
    while (true) {
      const std::size_t at = pos_;
      const auto op = static_cast<unsigned char>(bytes(1)[0]);
      switch (op) {
        case 's':  // SETITEM
          setitems(dict, at, false);
          break;
        case 'u':  // SETITEMS
          setitems(dict, at, true);
          break;
        case '.':  // STOP
          if (stack_.size() != 1 || !std::holds_alternative<Dict>(stack_[0]))
            fail(at, "the pickle does not end with one dict");
          if (pos_ != size_) fail(pos_, "bytes after the pickle's end");
          return dict;
        default:
          // The two groups take disjoint opcodes: which is asked first changes nothing.
          if (!skip_op(op) && !value_op(at, op)) unknown_op(at, op);
      }
    }
  }

 private:
  /// The opcodes that change nothing this reader keeps: framing and the memo, which a state_dict's
  /// pickle never reads back. False if `op` is none of them.
  bool skip_op(unsigned char op) {
    switch (op) {
      case 0x80:  // PROTO n
        bytes(1);
        return true;
      case 0x95:  // FRAME: a hint, the bytes follow anyway
        bytes(8);
        return true;
      case 'q':  // BINPUT: memo entries are never read
        bytes(1);
        return true;
      case 'r':  // LONG_BINPUT
        bytes(4);
        return true;
      case 0x94:  // MEMOIZE
        return true;
    }
    return false;
  }
  /// The opcodes that push a mark, a dict or a value. False if `op` is none of them.
  bool value_op(std::size_t at, unsigned char op) {
    switch (op) {
      case '}':  // EMPTY_DICT
        push(Dict{});
        return true;
      case '(':  // MARK
        push(Mark{});
        return true;
      case 0x88:  // NEWTRUE
        push(Bool{true});
        return true;
      case 0x89:  // NEWFALSE
        push(Bool{false});
        return true;
      case 'X':  // BINUNICODE
        push(text(unsigned_le(4)));
        return true;
      case 0x8c:  // SHORT_BINUNICODE
        push(text(unsigned_le(1)));
        return true;
      case 'K':  // BININT1
        push(std::int64_t(unsigned_le(1)));
        return true;
      case 'M':  // BININT2
        push(std::int64_t(unsigned_le(2)));
        return true;
      case 'J':  // BININT
        push(std::int64_t(std::int32_t(unsigned_le(4))));
        return true;
      case 0x8a:  // LONG1
        push(long1(at));
        return true;
      case 'G':  // BINFLOAT (big-endian)
        push(binfloat());
        return true;
    }
    return false;
  }
  [[noreturn]] void unknown_op(std::size_t at, unsigned char op) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", op);
    fail(at, std::string("pickle opcode ") + hex +
                 ", which a dict of floats and ints does not contain");
  }
  std::string text(std::uint64_t n) { return std::string(bytes(n), n); }
  std::int64_t long1(std::size_t at) {
    const std::size_t n = static_cast<unsigned char>(bytes(1)[0]);
    if (n > 8) fail(at, "an int wider than 64 bits");
    std::uint64_t v = unsigned_le(n);
    if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~std::uint64_t(0) << (8 * n);  // sign
    return static_cast<std::int64_t>(v);
  }
  double binfloat() {
    const auto* b = reinterpret_cast<const unsigned char*>(bytes(8));
    std::uint64_t bits = 0;
    for (int i = 0; i < 8; ++i)
      bits = (bits << 8) | b[i];
    double d;
    std::memcpy(&d, &bits, sizeof d);
    return d;
  }
  void push(Item i) {
    if (stack_.size() >= 1024) fail(pos_, "a pickle deeper than a state_dict's");
    stack_.push_back(std::move(i));
  }
  // SETITEM takes one key and value from the stack; SETITEMS every pair above the last mark.
  void setitems(StateDict& dict, std::size_t at, bool many) {
    std::size_t first = stack_.size() >= 2 ? stack_.size() - 2 : 0;
    if (many) {
      first = stack_.size();
      while (first > 0 && !std::holds_alternative<Mark>(stack_[first - 1]))
        --first;
      if (first == 0) fail(at, "SETITEMS without a mark");
    }
    if (many ? first < 2 : stack_.size() < 3) fail(at, "items set on nothing");
    const std::size_t target = many ? first - 2 : first - 1;
    if ((stack_.size() - first) % 2 != 0 || !std::holds_alternative<Dict>(stack_[target]))
      fail(at, "items set on something that is not a dict");
    if (target != 0) fail(at, "a dict inside the state_dict (it holds floats and ints only)");
    for (std::size_t i = first; i < stack_.size(); i += 2) {
      const auto* key = std::get_if<std::string>(&stack_[i]);
      if (!key) fail(at, std::string("a state_dict's keys are strings, got a ") + kind(stack_[i]));
      const Item& v = stack_[i + 1];
      if (const auto* d = std::get_if<double>(&v))
        dict.set(*key, *d);
      else if (const auto* n = std::get_if<std::int64_t>(&v))
        dict.set(*key, *n);
      else
        fail(at, "state_dict['" + *key + "'] must be a float or an int, got a " + kind(v));
    }
    stack_.resize(target + 1);
  }

  std::vector<Item> stack_;
};

}  // namespace

StateDict unpickle_state_dict(const char* data, std::size_t size) {
  return Reader(data, size).run();
}

}  // namespace ampactor::internal
