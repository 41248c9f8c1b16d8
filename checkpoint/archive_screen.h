// The screen load_checkpoint puts before LibTorch's TorchScript reader: a checkpoint archive is
// read by LibTorch only if it holds what ampactor's checkpoints hold (archive_screen.cpp: the
// records and the classes' code; pickle_screen.cpp: the pickles). LibTorch's reader compiles the
// archive's code and unpickles with no bounds checks of its own, so anything else is refused
// first. Not installed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "zip_check.h"

namespace ampactor::internal {

/// Why an archive is refused; what() names the record and, in a pickle, the byte.
class ArchiveProblem : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The bytes of a deflated entry as LibTorch's reader inflates them.
using Inflate = std::function<std::string(const ZipEntry&)>;

/// Throws ArchiveProblem unless the archive whose checked entries are `entries` (`data` its
/// bytes) holds what an archive written by torch::serialize::OutputArchive of values, tensors and
/// nested archives holds: modules of attributes and no code but their declarations. Deflated
/// entries (code only) are read through `inflate`, and checked against their CRC.
void screen_archive(const char* data, const std::vector<ZipEntry>& entries, const Inflate& inflate);

/// An attribute's type as LibTorch prints it in a module's code.
struct TypeExpr {
  enum Kind { Int, Float, Bool, Str, Tensor, None, Tuple, Class } kind = None;
  std::vector<TypeExpr> items;  // Tuple
  std::string name;             // Class: its qualified name
};

/// `t` as LibTorch prints it ("Tuple[float, float]").
std::string type_str(const TypeExpr& t);

/// A module class of the archive: its attributes in order.
struct ClassDef {
  std::vector<std::string> names;
  std::vector<TypeExpr> types;
};
using ClassTable = std::map<std::string, ClassDef>;  // by qualified name, "__torch__.Module"

/// The tensor storages: record key ("data/<key>") to its size in bytes.
using StorageTable = std::map<std::string, std::uint64_t>;

/// Throws ArchiveProblem unless `data.pkl` (`size` bytes) is one module object of a class in
/// `classes`, built as LibTorch's pickler builds it from the values above; `used` receives the
/// keys of the storages its tensors read.
void screen_data_pickle(const char* data, std::size_t size, const ClassTable& classes,
                        const StorageTable& storages, std::set<std::string>& used);

}  // namespace ampactor::internal
