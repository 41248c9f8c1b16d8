// A sub-archive of a LibTorch archive as a tree of values, to copy it from one file into another
// unchanged (the model and the optimizer's options, as a re-shard copies them).
#pragma once

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <memory>
#include <string>
#include <vector>

namespace ampactor::internal {

/// A sub-archive as a tree: each key's value, or its sub-archive.
struct ArchiveNode {
  struct Entry {
    std::string key;
    c10::IValue value;
    std::shared_ptr<ArchiveNode> sub;
  };
  std::vector<Entry> entries;
};

ArchiveNode read_node(torch::serialize::InputArchive& a);
/// `n` as the sub-archive `key` of `parent`.
void write_node(const ArchiveNode& n, torch::serialize::OutputArchive& parent,
                const std::string& key);

}  // namespace ampactor::internal
