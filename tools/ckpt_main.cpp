// ampactor-ckpt: checks, consolidates and re-shards the checkpoints of runs whose pipeline shards
// its optimizer state (save_run with shard_optimizer_state writes a manifest and a shard file
// per rank).
//   ampactor-ckpt check RUN                       every shard there, of its size and digest
//   ampactor-ckpt consolidate RUN OUT             one ordinary checkpoint (load_run, unsharded)
//   ampactor-ckpt reshard IN --world M OUT        a manifest and M shards (IN: a manifest or an
//                                                 ordinary checkpoint)
// Exit code: 0 done; 1 a checkpoint refused (the message names the rank and the reason); 2 bad
// arguments.
#include <ampactor/checkpoint/sharded_checkpoint.h>
#include <ampactor/core/errors.h>

#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>

namespace {

void describe(const ampactor::ShardManifest& m, const std::string& path) {
  std::cout << path << ": step " << m.step << ", " << m.layout().str() << "\n";
  for (const auto& s : m.shards)
    std::cout << "  rank " << s.rank << ": " << s.file << ", " << s.bytes << " bytes, " << s.digest
              << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ampactor-ckpt: check, consolidate and re-shard sharded run checkpoints"};
  app.require_subcommand(1);
  std::string in, out;
  int world = 0;
  CLI::App* check = app.add_subcommand("check", "check each shard's size and digest");
  check->add_option("run", in, "the manifest (save_run's path)")->required();
  CLI::App* consolidate =
      app.add_subcommand("consolidate", "the shards as one ordinary checkpoint");
  consolidate->add_option("run", in, "the manifest")->required();
  consolidate->add_option("out", out, "the checkpoint to write")->required();
  CLI::App* reshard = app.add_subcommand("reshard", "the run as shards of another world size");
  reshard->add_option("in", in, "a manifest, or an ordinary checkpoint")->required();
  reshard->add_option("--world", world, "the new number of ranks")->required();
  reshard->add_option("out", out, "the new manifest (its shards go beside it)")->required();
  CLI11_PARSE(app, argc, argv);
  // Progress on stderr, a line per file: a large run's shards take a while each.
  const auto say = [](const std::string& line) { std::cerr << "  " << line << "\n"; };
  try {
    if (check->parsed()) {
      describe(ampactor::check_sharded_run(in), in);
      std::cout << "every shard is whole\n";
    } else if (consolidate->parsed()) {
      std::cerr << "consolidating " << in << " into " << out << "\n";
      ampactor::consolidate_run(in, out, say);
      std::cout << "wrote " << out << "\n";
    } else {
      std::cerr << "re-sharding " << in << " over " << world << " ranks into " << out << "\n";
      ampactor::reshard_run(in, world, out, say);
      describe(ampactor::read_manifest(out), out);
    }
    return 0;
  } catch (const ampactor::ScalerError& e) {
    std::cerr << "ampactor-ckpt: " << e.what() << "\n";
    return e.code() == ampactor::errc::bad_option ? 2 : 1;
  } catch (const std::exception& e) {
    std::cerr << "ampactor-ckpt: " << e.what() << "\n";
    return 1;
  }
}
