// ampactor-bench-overlap: what the asynchronous optimizer buys. The same training workload (an
// MLP, Adam over fp32 masters, the exact policy) runs with the pipeline synchronous (staleness 0)
// and asynchronous (staleness 1), side by side in one run, with the batch chosen so that the
// optimizer step costs about as much as forward+backward. It also measures how long the main
// thread waits in scale() (the ScaleRequest of the exact policy) as a share of iteration time.
// One LibTorch thread on each side: the trainer's and the optimizer's, one core each.
// Two controls explain the result on a given machine: how much slower in-cache arithmetic, cache
// copies and memory copies run on both cores at once than alone, and the pipeline with the Adam
// step replaced by in-cache arithmetic of the same cost (no competition for memory).
// Not a test: it reports figures and goals and never fails on them.
#include "bench_overlap.h"
#include "bench_setup.h"

using namespace ampactor::bench::overlap;

int main(int argc, char** argv) {
  CLI::App app{"ampactor-bench-overlap: asynchronous vs synchronous optimizer pipeline"};
  std::string workload = "mlp";
  Config mlp{"mlp", 0, 0, 512, 1024, 0};
  Config emb{"embed", 25000, 16, 256, 1024, 0};
  int rounds = 10, iters = 40, warmup = 3;
  std::string json_path;
  bool quick = false;
  app.add_option("--workload", workload, "mlp (the default), embed, or all (each in turn)")
      ->check(CLI::IsMember({"mlp", "embed", "all"}));
  app.add_option("--dim", mlp.dim, "mlp: the MLP's input and output width")
      ->check(CLI::Range(8, 1 << 16));
  app.add_option("--hidden", mlp.hidden, "mlp: the MLP's hidden width")
      ->check(CLI::Range(8, 1 << 16));
  app.add_option("--batch", mlp.batch,
                 "mlp: rows per iteration (0: fitted so that forward+backward costs about as "
                 "much as --balance says)")
      ->check(CLI::Range(0, 1 << 20));
  std::string balance = "step";
  app.add_option("--balance", balance,
                 "what a fitted batch balances forward+backward against: step (the synchronous "
                 "pipeline's whole optimizer step: grad move, Adam, weight copy; the default) or "
                 "adam (the Adam step alone)")
      ->check(CLI::IsMember({"step", "adam"}));
  app.add_option("--vocab", emb.vocab, "embed: the table's rows")->check(CLI::Range(16, 1 << 26));
  app.add_option("--embed-dim", emb.dim, "embed: the table's width (the MLP's input width)")
      ->check(CLI::Range(8, 1 << 16));
  app.add_option("--embed-hidden", emb.hidden, "embed: the MLP's hidden width")
      ->check(CLI::Range(8, 1 << 16));
  app.add_option("--tokens", emb.tokens, "embed: table rows averaged per input row")
      ->check(CLI::Range(1, 1 << 12));
  app.add_option("--embed-batch", emb.batch, "embed: rows per iteration (0: fitted, as --batch)")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--rounds", rounds, "interleaved rounds; each runs every mode")
      ->check(CLI::Range(1, 1000));
  app.add_option("--iterations", iters, "timed iterations per mode and round")
      ->check(CLI::Range(1, 100000));
  app.add_option("--json", json_path, "write the figures as JSON to this file");
  app.add_flag("--quick", quick, "small models and few rounds (a smoke run)");
  CLI11_PARSE(app, argc, argv);
  if (quick) {
    mlp.dim = 256, mlp.hidden = 512, rounds = 2, iters = 5;
    emb.vocab = 1 << 14, emb.dim = 64, emb.hidden = 256;
  }
  std::ofstream json_file;
  if (!json_path.empty()) {
    json_file.open(json_path);
    if (!json_file) {
      std::cerr << "--json: cannot write " << json_path << "\n";
      return 2;
    }
  }
  // Keep freed tensors' memory in the process, as LibTorch's GPU caching allocator does: glibc
  // otherwise maps and unmaps every large gradient, and its page faults cost as much as the
  // arithmetic on this scale, for every mode alike.
  // 32 MiB is glibc's largest threshold; the default workloads keep every tensor below it.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  at::set_num_threads(1);
  at::get_num_threads();  // LibTorch's per-thread lazy set-up, before any other thread's
  std::cout << "ampactor-bench-overlap: LibTorch " << TORCH_VERSION << ", "
            << std::thread::hardware_concurrency()
            << " hardware threads; one LibTorch thread for the trainer, one for the optimizer\n";

  json res = {{"benchmark", "ampactor-bench-overlap"},
              {"torch", TORCH_VERSION},
              {"hardware_threads", std::thread::hardware_concurrency()},
              {"machine", machine_probe()}};
  mlp.balance = emb.balance = balance;
  for (const Config& c : {mlp, emb})
    if (workload == "all" || workload == c.kind)
      res["workloads"][c.kind] = bench_workload(c, rounds, iters, warmup, quick);
  if (!json_path.empty()) {
    res["setup"] = ampactor::bench::run_setup();
    json_file << std::setw(2) << res << "\n";
    std::cout << "wrote " << json_path << "\n";
  }
  return 0;
}
