// A sub-archive as a tree of values, read from one archive and written into another unchanged.
#include "internal/archive_tree.h"

namespace ampactor::internal {

using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

namespace {

void write_entries(const ArchiveNode& n, OutputArchive& a) {
  for (const ArchiveNode::Entry& e : n.entries) {
    if (e.sub) {
      write_node(*e.sub, a, e.key);
    } else if (e.value.isTensor()) {  // a model's parameter (it requires grad) or buffer
      const at::Tensor t = e.value.toTensor();
      a.write(e.key, t, /*is_buffer=*/!t.requires_grad());
    } else {
      a.write(e.key, e.value);
    }
  }
}

}  // namespace

ArchiveNode read_node(InputArchive& a) {
  ArchiveNode n;
  for (const std::string& k : a.keys()) {
    InputArchive sub;
    c10::IValue v;
    if (a.try_read(k, sub))
      n.entries.push_back({k, {}, std::make_shared<ArchiveNode>(read_node(sub))});
    else if (a.try_read(k, v))
      n.entries.push_back({k, v, nullptr});
  }
  return n;
}

void write_node(const ArchiveNode& n, OutputArchive& parent, const std::string& key) {
  OutputArchive a(parent.compilation_unit());
  write_entries(n, a);
  parent.write(key, a);
}

}  // namespace ampactor::internal
