// The records of a checkpoint archive and the code of its classes. LibTorch's reader compiles
// every class the pickle names from the archive's code/ records; ampactor's checkpoints hold
// modules of attributes only, whose code is a declaration LibTorch prints the same way every
// time. So each code record is read, printed again as LibTorch prints it, and must come out
// byte for byte the same: any method, statement or other layout is refused, and so is any record
// that such an archive does not hold.
#include "archive_screen.h"

#include <algorithm>
#include <cstring>
#include <string_view>
#include <unordered_set>

namespace ampactor::internal {

namespace {

[[noreturn]] void refuse(const std::string& why) {
  throw ArchiveProblem(why);
}

// What LibTorch 1.13 writes in every archive of modules without methods: the oldest file format
// version (no code needs a newer one), an empty table of constants, and, beside each class's
// code, the source ranges of a class without methods.
const std::string kVersion = "3\n";
const std::string kConstants("\x80\x02).", 4);
const std::string kDebugPickle(
    "\x80\x02X\x18\x00\x00\x00"
    "FORMAT_WITH_STRING_TABLEq\x00X\x00\x00\x00\x00q\x01\x85q\x02K\x00"
    "ctorch.jit._pickle\nbuild_intlist\nq\x03(](etRK\x00K\x00\x87q\x04K\x00K\x00\x87K\x00\x87"
    "\x85q\x05\x87.",
    106);
constexpr int kMaxTypeDepth = 8, kMaxModuleDepth = 64;
// Far more than the code of any module's attributes: a bound on what inflating one may allocate.
constexpr std::uint64_t kMaxCode = 16 << 20;

bool starts_with(const std::string& s, const std::string& p) {
  return s.compare(0, p.size(), p) == 0;
}
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}
/// A number as LibTorch writes record keys and mangled names: decimal, no leading zero.
bool is_number(const std::string& s) {
  if (s.empty() || s.size() > 9 || (s[0] == '0' && s.size() > 1)) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}
bool is_letter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
/// LibTorch's printer's test: such a name is printed as `name : T`, any other in quotes.
bool is_identifier(const std::string& s) {
  if (s.empty() || !is_letter(s[0])) return false;
  for (char c : s)
    if (!is_letter(c) && (c < '0' || c > '9')) return false;
  return true;
}
/// Names LibTorch's printer would print bare, but its parser reads as something else.
bool is_reserved(const std::string& s) {
  static const char* const words[] = {
      "False", "None",     "True",  "and",    "as",   "assert", "async",  "await",    "break",
      "class", "continue", "def",   "del",    "elif", "else",   "except", "finally",  "for",
      "from",  "global",   "if",    "import", "in",   "is",     "lambda", "nonlocal", "not",
      "or",    "pass",     "raise", "return", "try",  "while",  "with",   "yield"};
  for (const char* w : words)
    if (s == w) return true;
  return s.size() > 4 && starts_with(s, "__") && ends_with(s, "__");
}
/// A name LibTorch prints inside double quotes, which it does not escape.
bool is_quotable(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < 0x20 || c > 0x7e || c == '"' || c == '\\') return false;
  return true;
}

/// The qualified name of the class in code record `rel` ("code/__torch__.py" holds
/// "__torch__.Module"), or "" if LibTorch puts no class of an archive there.
std::string class_of_code(const std::string& rel) {
  if (rel == "code/__torch__.py") return "__torch__.Module";
  const std::string pre = "code/__torch__/___torch_mangle_";
  if (!starts_with(rel, pre) || !ends_with(rel, ".py")) return {};
  const std::string n = rel.substr(pre.size(), rel.size() - pre.size() - 3);
  return is_number(n) ? "__torch__.___torch_mangle_" + n + ".Module" : std::string();
}

/// Reads one type from `s` at `pos`, as LibTorch prints the types of archive values.
class TypeReader {
 public:
  TypeReader(const std::string& s, std::size_t pos) : s_(s), pos_(pos) {}
  /// The type that runs to the end of the line; false if there is none.
  bool read_all(TypeExpr& t) {
    if (!read(t, 0)) return false;
    return pos_ == s_.size();
  }

 private:
  bool eat(const char* word) {
    const std::size_t n = std::strlen(word);
    if (s_.compare(pos_, n, word) != 0) return false;
    pos_ += n;
    return true;
  }
  bool read(TypeExpr& t, int depth) {
    if (depth > kMaxTypeDepth) return false;
    static const std::pair<const char*, TypeExpr::Kind> simple[] = {
        {"int", TypeExpr::Int}, {"float", TypeExpr::Float},   {"bool", TypeExpr::Bool},
        {"str", TypeExpr::Str}, {"Tensor", TypeExpr::Tensor}, {"NoneType", TypeExpr::None}};
    if (eat("Tuple[")) {
      t.kind = TypeExpr::Tuple;
      if (eat("()]")) return true;
      do {
        t.items.emplace_back();
        if (!read(t.items.back(), depth + 1)) return false;
      } while (eat(", "));
      return eat("]");
    }
    if (eat("__torch__.")) {
      t.kind = TypeExpr::Class;
      t.name = "__torch__.";
      if (eat("___torch_mangle_")) {
        const std::size_t end = s_.find('.', pos_);
        if (end == std::string::npos || !is_number(s_.substr(pos_, end - pos_))) return false;
        t.name += "___torch_mangle_" + s_.substr(pos_, end - pos_ + 1);
        pos_ = end + 1;
      }
      t.name += "Module";
      return eat("Module");
    }
    for (const auto& [word, kind] : simple)
      if (eat(word)) {
        t.kind = kind;
        return true;
      }
    return false;
  }

  const std::string& s_;
  std::size_t pos_;
};

/// The names in a line `head"a", "b", ]`, as LibTorch prints __parameters__ and __buffers__.
bool read_names(const std::string& line, const std::string& head, std::vector<std::string>& out) {
  if (!starts_with(line, head)) return false;
  std::size_t at = head.size();
  while (at < line.size() && line[at] == '"') {
    const std::size_t end = line.find('"', at + 1);
    if (end == std::string::npos || line.compare(end, 3, "\", ") != 0) return false;
    out.push_back(line.substr(at + 1, end - at - 1));
    at = end + 3;
  }
  return line.compare(at, std::string::npos, "]") == 0;
}

/// The lines of `code`, each of which must end with a newline (`bad` names the record).
std::vector<std::string> code_lines(const std::string& code, const std::string& bad) {
  std::vector<std::string> lines;
  for (std::size_t at = 0; at < code.size();) {
    const std::size_t end = code.find('\n', at);
    if (end == std::string::npos) refuse(bad + "does not end its last line");
    lines.push_back(code.substr(at, end - at));
    at = end + 1;
  }
  return lines;
}

/// The attributes declared from line 4 on: `name : T`, or `__annotations__["name"] = T` for a
/// name LibTorch quotes (after an empty `__annotations__ = []` where the first one is quoted).
ClassDef read_attributes(const std::vector<std::string>& lines, const std::string& bad) {
  ClassDef c;
  for (std::size_t i = 3; i < lines.size(); ++i) {
    const std::string& l = lines[i];
    if (i == 3 && l == "  __annotations__ = []") continue;
    std::size_t type_at = std::string::npos;
    if (starts_with(l, "  __annotations__[\"")) {
      const std::size_t end = l.find('"', 19);
      if (end != std::string::npos && l.compare(end, 5, "\"] = ") == 0) {
        c.names.push_back(l.substr(19, end - 19));
        type_at = end + 5;
      }
    } else if (const std::size_t colon = l.find(" : "); starts_with(l, "  ") && colon != l.npos) {
      c.names.push_back(l.substr(2, colon - 2));
      type_at = colon + 3;
    }
    c.types.emplace_back();
    if (type_at == std::string::npos || !TypeReader(l, type_at).read_all(c.types.back()))
      refuse(bad + "line " + std::to_string(i + 1) +
             " is not an attribute of a type ampactor writes");
  }
  return c;
}

/// The names must be ones LibTorch's parser reads back as the same names, each once.
void check_names(const ClassDef& c, const std::string& bad) {
  std::unordered_set<std::string_view> seen;  // linear: a code record may declare a million
  for (const std::string& n : c.names) {
    if (!is_quotable(n) || (is_identifier(n) && is_reserved(n)))
      refuse(bad + "has an attribute named '" + shown(n) + "', which ampactor never writes");
    if (!seen.insert(n).second) refuse(bad + "declares '" + shown(n) + "' twice");
  }
}

/// The class printed again as LibTorch prints it: parameters and buffers in attribute order, each
/// a tensor once; the annotations list where the first attribute needs it.
std::string print_class(const ClassDef& c, const std::vector<std::string>& params,
                        const std::vector<std::string>& buffers, const std::string& bad) {
  std::string again = "class Module(Module):\n  __parameters__ = [";
  std::string buffer_list = "]\n  __buffers__ = [", body;
  const std::unordered_set<std::string_view> param_set(params.begin(), params.end()),
      buffer_set(buffers.begin(), buffers.end());
  for (std::size_t i = 0; i < c.names.size(); ++i) {
    const std::string& n = c.names[i];
    const bool param = param_set.count(n) > 0, buffer = buffer_set.count(n) > 0;
    if ((param || buffer) && c.types[i].kind != TypeExpr::Tensor)
      refuse(bad + "lists '" + shown(n) + "' as a tensor, which it is not");
    if (param) again += "\"" + n + "\", ";
    if (buffer) buffer_list += "\"" + n + "\", ";
    if (i == 0 && !is_identifier(n)) body += "  __annotations__ = []\n";
    body += is_identifier(n) ? "  " + n + " : " : "  __annotations__[\"" + n + "\"] = ";
    body += type_str(c.types[i]) + "\n";
  }
  return again + buffer_list + "]\n" + body;
}

/// The class in code record `rel`, whose text is `code`: refused unless it is exactly what
/// LibTorch prints for a module class of attributes.
ClassDef read_class(const std::string& rel, const std::string& code) {
  const std::string bad = "record '" + shown(rel) + "' ";
  const std::vector<std::string> lines = code_lines(code, bad);
  std::vector<std::string> params, buffers;
  if (lines.size() < 3 || lines[0] != "class Module(Module):" ||
      !read_names(lines[1], "  __parameters__ = [", params) ||
      !read_names(lines[2], "  __buffers__ = [", buffers))
    refuse(bad + "is not the code LibTorch writes for a module of attributes");
  ClassDef c = read_attributes(lines, bad);
  check_names(c, bad);
  if (print_class(c, params, buffers, bad) != code)
    refuse(bad + "is not the code LibTorch writes for a module of attributes");
  return c;
}

void class_refs(const TypeExpr& t, std::vector<std::string>& out) {
  if (t.kind == TypeExpr::Class) out.push_back(t.name);
  for (const TypeExpr& i : t.items)
    class_refs(i, out);
}

/// How deep the modules of class `name` nest (1: it holds no module). Every class it refers to
/// must be in the archive, none may contain itself (LibTorch's importer would recurse without
/// end), and none nest deeper than kMaxModuleDepth. `chain`: the classes above this one.
int nesting(const ClassTable& classes, const std::string& name, int chain,
            std::map<std::string, int>& depth) {
  if (const auto known = depth.find(name); known != depth.end()) {
    if (known->second == 0) refuse("class " + name + " contains itself");
    return known->second;
  }
  if (chain >= kMaxModuleDepth) refuse("modules nested deeper than ampactor's checkpoints nest");
  depth[name] = 0;  // being measured
  std::vector<std::string> refs;
  for (const TypeExpr& t : classes.at(name).types)
    class_refs(t, refs);
  int d = 1;
  for (const std::string& r : refs) {
    if (!classes.count(r)) refuse("class " + name + " refers to " + r + ", whose code is missing");
    d = std::max(d, 1 + nesting(classes, r, chain + 1, depth));
  }
  if (d > kMaxModuleDepth) refuse("modules nested deeper than ampactor's checkpoints nest");
  return depth[name] = d;
}

/// What the records of an archive hold, as screen_record sorts them.
struct Records {
  const ZipEntry* pickle = nullptr;
  bool version = false, constants = false;
  ClassTable classes;
  StorageTable storages;
  std::vector<std::string> debug;  // the classes that have a source map
};

/// The folder every record must be in: the first's, as LibTorch looks every record up there.
std::string records_folder(const std::vector<ZipEntry>& entries) {
  const std::string& first = entries.at(0).name;
  const std::size_t slash = first.find('/');
  if (slash == std::string::npos || slash == 0)
    refuse("record '" + shown(first) + "' is not in a folder");
  return first.substr(0, slash + 1);
}

/// Record `e` (in `folder`), refused unless it is one an archive of modules holds; what it holds
/// goes to `out`.
void screen_record(const char* data, const ZipEntry& e, const std::string& folder,
                   const Inflate& inflate, Records& out) {
  if (!starts_with(e.name, folder))
    refuse("record '" + shown(e.name) + "' is outside the folder '" + shown(folder) + "'");
  const std::string rel = e.name.substr(folder.size());
  const bool code = !class_of_code(rel).empty();
  if (e.deflated && !code)
    refuse("record '" + shown(rel) + "' is compressed, which LibTorch does to code alone");
  if (code && e.size > kMaxCode) refuse("record '" + shown(rel) + "' holds too much code");
  const auto text = [&] {
    if (!e.deflated) return std::string(data + e.data_at, e.size);
    std::string s = inflate(e);
    if (s.size() != e.size || crc32(s.data(), s.size()) != e.crc)
      refuse("record '" + shown(rel) + "' does not match its checksum (the file is corrupt)");
    return s;
  };
  // Compared where they lie: a record may be as large as the file.
  const auto holds = [&](const std::string& want) {
    return e.size == want.size() && std::memcmp(data + e.data_at, want.data(), e.size) == 0;
  };
  if (rel == "version") {
    out.version = true;
    if (!holds(kVersion)) refuse("record 'version' is not the '3' LibTorch writes");
  } else if (rel == "constants.pkl") {
    out.constants = true;
    if (!holds(kConstants))
      refuse("record 'constants.pkl' is not the empty table of constants LibTorch writes");
  } else if (rel == "byteorder") {  // LibTorch 2.x; "big" would have it swap every tensor
    if (!holds("little"))
      refuse("record 'byteorder' is not the 'little' LibTorch 2.x writes on this machine");
  } else if (rel == ".data/serialization_id") {  // LibTorch 2.x: 40 decimal digits
    const char* id = data + e.data_at;
    if (e.size != 40 || !std::all_of(id, id + 40, [](char c) { return c >= '0' && c <= '9'; }))
      refuse("record '.data/serialization_id' is not the 40 digits LibTorch 2.x writes");
  } else if (rel == "data.pkl") {
    out.pickle = &e;
  } else if (starts_with(rel, "data/") && is_number(rel.substr(5))) {
    out.storages[rel.substr(5)] = e.size;
  } else if (code) {
    out.classes[class_of_code(rel)] = read_class(rel, text());
  } else if (ends_with(rel, ".debug_pkl") &&
             !class_of_code(rel.substr(0, rel.size() - 10)).empty()) {
    if (!holds(kDebugPickle))
      refuse("record '" + shown(rel) + "' is not the source map of a class without methods");
    out.debug.push_back(class_of_code(rel.substr(0, rel.size() - 10)));
  } else {
    refuse("record '" + shown(rel) + "', which ampactor's checkpoints never hold");
  }
}

/// Every source map beside its class's code, and the records every archive holds.
void check_complete(const Records& r) {
  for (const std::string& name : r.debug)
    if (!r.classes.count(name)) refuse("the source map of " + name + " without its code");
  if (!r.version || !r.constants || !r.pickle)
    refuse(std::string("no record '") +
           (!r.version     ? "version"
            : !r.constants ? "constants.pkl"
                           : "data.pkl") +
           "'");
}

}  // namespace

std::string type_str(const TypeExpr& t) {
  static const char* const simple[] = {"int", "float", "bool", "str", "Tensor", "NoneType"};
  if (t.kind == TypeExpr::Class) return t.name;
  if (t.kind != TypeExpr::Tuple) return simple[t.kind];
  if (t.items.empty()) return "Tuple[()]";
  std::string s = "Tuple[";
  for (std::size_t i = 0; i < t.items.size(); ++i)
    s += (i ? ", " : "") + type_str(t.items[i]);
  return s + "]";
}

void screen_archive(const char* data, const std::vector<ZipEntry>& entries,
                    const Inflate& inflate) {
  const std::string folder = records_folder(entries);
  Records records;
  for (const ZipEntry& e : entries)
    screen_record(data, e, folder, inflate, records);
  check_complete(records);
  const ClassTable& classes = records.classes;
  std::map<std::string, int> depth;
  for (const auto& c : classes)
    nesting(classes, c.first, 0, depth);
  std::set<std::string> used;
  const ZipEntry* pickle = records.pickle;
  screen_data_pickle(data + pickle->data_at, pickle->size, classes, records.storages, used);
  for (const auto& s : records.storages)
    if (!used.count(s.first)) refuse("record 'data/" + s.first + "' is no tensor's storage");
}

}  // namespace ampactor::internal
