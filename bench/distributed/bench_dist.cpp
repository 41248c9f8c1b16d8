// ampactor-bench-dist: data parallel on loopback (gloo). Run without RANK in the environment it
// launches itself with ampactor-launch for each --nproc value and prints rank 0's figures:
//  1. the found_inf agreement: RankGroup::all_max of the 2 floats each unscale agrees, timed
//     call by call (median, p99), and a GradScaler loop's iteration with ranks and without them,
//     side by side in alternating blocks;
//  2. the gradient exchanges: gloo's all-reduce beside RankGroup's average (its sums in rank
//     order) and reduce_scatter, in turn;
//  3. the data-parallel pipeline: what the trainer waits for per iteration (in step() and in
//     scale()) at staleness 0 and at staleness 1 with defer + swap, beside what the gradient
//     average itself takes on the optimizer thread.
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/distributed/dist.h>
#include <ampactor/pipeline/async_optimizer.h>

#include <ATen/Parallel.h>
#include <ATen/ops/cat.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "bench_setup.h"
#include "bench_util.h"
#include "timed_ranks.h"

using namespace ampactor;
using bench::Clock;
using bench::TimedRanks;

namespace {

double pct(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, std::size_t(q * double(v.size())))];
}

nlohmann::json agreement(const dist::World& w, int iters) {
  float v[2] = {0, 0};
  for (int i = 0; i < 200; ++i)
    w.ranks->all_max(v, 2);
  std::vector<double> us;
  for (int i = 0; i < iters; ++i) {
    v[0] = (i % 97 == 0 && w.launch.rank == 0) ? 1.0f : 0.0f;
    const auto t0 = Clock::now();
    w.ranks->all_max(v, 2);
    us.push_back(bench::us_since(t0));
  }
  // A GradScaler loop on a small model, with ranks and without, alternating blocks.
  auto loop_ms = [&](bool with_ranks, int steps) {
    torch::manual_seed(1);
    torch::nn::Linear net(64, 64);
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(1e-3));
    GradScaler scaler(GradScalerOptions().ranks(with_ranks ? w.ranks : nullptr));
    const at::Tensor x = at::randn({32, 64});
    std::vector<double> ms;
    for (int k = 0; k < steps; ++k) {
      const auto t0 = Clock::now();
      opt.zero_grad();
      scaler.scale(net->forward(x).pow(2).mean()).backward();
      scaler.step(opt);
      scaler.update();
      if (k >= 10) ms.push_back(bench::ms_since(t0));
    }
    return bench::median_of(ms);
  };
  std::vector<double> with, without;
  for (int b = 0; b < 5; ++b) {
    without.push_back(loop_ms(false, 110));
    with.push_back(loop_ms(true, 110));
  }
  // In the pipeline the agreement rides in the gradient average's round: the average of 1 MiB
  // of fp32 gradients with the 2 agreed values and without them, alternately.
  std::vector<at::Tensor> grads{at::randn({1 << 18})};
  std::vector<double> plain_us, riding_us;
  for (int i = 0; i < iters / 4 + 20; ++i) {
    // Each order in turn, so that neither form always runs second.
    float vals[2] = {0, 0};
    double p = 0, r = 0;
    for (int half = 0; half < 2; ++half) {
      const bool riding = (half == 0) == (i % 2 == 1);
      const auto t0 = Clock::now();
      if (riding)
        w.ranks->average(grads, vals, 2), r = bench::us_since(t0);
      else
        w.ranks->average(grads), p = bench::us_since(t0);
    }
    if (i >= 20) plain_us.push_back(p), riding_us.push_back(r);
  }
  return {{"all_max_us_median", bench::median_of(us)},
          {"all_max_us_p99", pct(us, 0.99)},
          {"loop_ms_without_ranks", bench::median_of(without)},
          {"loop_ms_with_ranks", bench::median_of(with)},
          {"average_1mib_us_median", bench::median_of(plain_us)},
          {"average_1mib_with_agreement_us_median", bench::median_of(riding_us)},
          {"average_1mib_with_agreement_us_p99", pct(riding_us, 0.99)},
          {"average_1mib_us_p99", pct(plain_us, 0.99)}};
}

nlohmann::json pipeline(const dist::World& w, int staleness, std::int64_t width, int steps) {
  auto timed = std::make_shared<TimedRanks>(w.ranks);
  torch::manual_seed(1);
  torch::nn::Sequential net(torch::nn::Linear(width, width), torch::nn::Linear(width, width));
  GradScaler scaler(GradScalerOptions().ranks(timed));
  AsyncOptimizer pipe(net->parameters(), scaler,
                      AsyncOptimizerOptions()
                          .staleness(staleness)
                          .optimizer_threads(1)
                          .swap_weights(staleness == 1)
                          .defer_grad_move(staleness == 1));
  torch::optim::SGD opt(pipe.optim_parameters(), torch::optim::SGDOptions(1e-4));
  const at::Tensor x = at::randn({256, width});
  std::vector<double> wait, total;
  for (int k = 0; k < steps; ++k) {
    const auto t0 = Clock::now();
    net->zero_grad();
    at::Tensor loss = net->forward(x).pow(2).mean();
    const auto s0 = Clock::now();
    at::Tensor scaled = scaler.scale(loss);  // exact: waits for the last unscale's agreement
    double waited = bench::ms_since(s0);
    scaled.backward();
    const auto p0 = Clock::now();
    pipe.step(opt, [&] { scaler.step(opt); });
    waited += bench::ms_since(p0);
    scaler.update();
    if (k >= 5) wait.push_back(waited), total.push_back(bench::ms_since(t0));
  }
  pipe.sync();
  const auto& each = timed->average_ms;
  std::vector<double> avg(each.begin() + std::min<std::size_t>(5, each.size()), each.end());
  return {{"staleness", staleness},
          {"params", 2 * (width * width + width)},
          {"iteration_ms", bench::median_of(total)},
          {"trainer_wait_ms", bench::median_of(wait)},
          {"grad_average_ms", bench::median_of(avg)}};
}

/// The gradient exchanges side by side, each form in each place in turn, on 1 MiB and 16 MiB of
/// fp32: gloo's all-reduce as the average made it before its sums in rank order (the tensors into a
/// bucket, SUM, divided, copied back),
/// RankGroup::average (all-to-all, the sums in rank order, one broadcast per cut) and
/// RankGroup::reduce_scatter (the all-to-all alone, even cuts: the sharded state's).
nlohmann::json exchanges(const dist::World& w, int rounds) {
  const int size = w.launch.world_size;
  nlohmann::json out = nlohmann::json::array();
  for (const std::int64_t n : {std::int64_t(1) << 18, std::int64_t(1) << 22}) {
    const at::Tensor g = at::randn({n});
    std::vector<std::int64_t> bounds;
    for (int r = 0; r <= size; ++r)
      bounds.push_back(n * r / size);
    std::vector<double> us[3];
    const int count = n > (1 << 20) ? std::max(rounds / 8, 5) : rounds;
    for (int i = 0; i < count + 3; ++i)
      for (int k = 0; k < 3; ++k) {
        const int form = (i + k) % 3;  // the same on every rank
        at::Tensor t = g.clone();
        std::vector<at::Tensor> list{t};
        const auto t0 = Clock::now();
        if (form == 0) {  // as average made it before: into a bucket, all-reduced, back
          std::vector<at::Tensor> flat{at::cat(list)};
          c10d::AllreduceOptions o;
          o.reduceOp = c10d::ReduceOp::SUM;
          w.pg->allreduce(flat, o)->wait();
          t.copy_(flat[0].div_(double(size)));
        } else if (form == 1) {
          w.ranks->average(list);
        } else {
          w.ranks->reduce_scatter(t, bounds);
        }
        if (i >= 3) us[form].push_back(bench::us_since(t0));
      }
    out.push_back({{"bytes", n * 4},
                   {"rounds", count},
                   {"allreduce_us_median", bench::median_of(us[0])},
                   {"average_us_median", bench::median_of(us[1])},
                   {"reduce_scatter_us_median", bench::median_of(us[2])}});
  }
  return out;
}

/// The machine's floor for any exchange between two processes: an 8-byte TCP round trip on
/// loopback (median, p99 in us), between this process and a forked echo.
std::pair<double, double> tcp_round_trip(int iters) {
  const int ls = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (ls < 0 || ::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len) != 0 || ::listen(ls, 1) != 0)
    throw std::runtime_error("the round-trip probe cannot listen");
  const int one = 1;
  const pid_t child = ::fork();
  if (child == 0) {
    const int c = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) ::_exit(1);
    ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    char b[8];
    while (::read(c, b, 8) == 8)
      if (::write(c, b, 8) != 8) break;
    ::_exit(0);
  }
  const int s = ::accept(ls, nullptr, nullptr);
  ::setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::vector<double> us;
  char b[8] = {};
  for (int i = 0; i < iters + 200; ++i) {
    const auto t0 = Clock::now();
    if (::write(s, b, 8) != 8 || ::read(s, b, 8) != 8) break;
    if (i >= 200) us.push_back(bench::us_since(t0));
  }
  ::close(s), ::close(ls), ::waitpid(child, nullptr, 0);
  if (us.empty()) throw std::runtime_error("the round-trip probe failed");
  return {bench::median_of(us), pct(us, 0.99)};
}

int worker(int iters, std::int64_t width, int steps, const std::string& out) {
  at::set_num_threads(1);
  const dist::World w = dist::init_from_env();
  nlohmann::json j = {{"ranks", w.launch.world_size}, {"agreement", agreement(w, iters)}};
  j["exchange"] = exchanges(w, iters / 4);
  j["pipeline"] = {pipeline(w, 0, width, steps), pipeline(w, 1, width, steps)};
  j["setup"] = ampactor::bench::run_setup();
  if (w.launch.rank == 0) std::ofstream(out) << j.dump(2);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ampactor-bench-dist: the found_inf agreement and the data-parallel pipeline"};
  std::vector<int> nprocs{2, 4};
  int iters = 2000, steps = 40;
  std::int64_t width = 1024;
  std::string json, part;
  app.add_option("--nproc", nprocs, "rank counts, each a run of its own")->check(CLI::Range(2, 64));
  app.add_option("--iters", iters, "timed agreements per run")->check(CLI::Range(10, 1000000));
  app.add_option("--width", width, "the pipeline model's width (2 square layers)")
      ->check(CLI::Range(8, 16384));
  app.add_option("--steps", steps, "pipeline iterations per staleness")
      ->check(CLI::Range(10, 100000));
  app.add_option("--json", json, "write the figures as JSON to this file");
  app.add_option("--part", part, "(internal) a rank's output file");
  CLI11_PARSE(app, argc, argv);
  try {
    if (std::getenv("RANK")) return worker(iters, width, steps, part);
    nlohmann::json all = nlohmann::json::array();
    std::cout << "ampactor-bench-dist: gloo on loopback, 1 LibTorch thread per rank\n\n";
    const auto [rt, rt99] = tcp_round_trip(iters);
    std::cout << std::fixed << std::setprecision(1)
              << "the machine's floor: an 8-byte TCP round trip between two processes on "
                 "loopback, "
              << rt << " us median, " << rt99 << " us p99\n";
    nlohmann::json floor = {{"tcp_round_trip_us_median", rt}, {"tcp_round_trip_us_p99", rt99}};
    for (int n : nprocs) {
      const std::string p = "/tmp/ampactor-bench-dist-" + std::to_string(::getpid()) + ".json";
      std::ostringstream cmd;
      cmd << AMPACTOR_LAUNCH << " --nproc " << n << " --master-port 0 -- " << argv[0] << " --iters "
          << iters << " --width " << width << " --steps " << steps << " --part " << p;
      if (std::system(cmd.str().c_str()) != 0)
        throw std::runtime_error("the run of " + std::to_string(n) + " ranks failed");
      nlohmann::json j;
      std::ifstream(p) >> j;
      std::remove(p.c_str());
      all.push_back(j);
      const auto& a = j["agreement"];
      std::cout << std::fixed << std::setprecision(1) << n << " ranks: found_inf agreement "
                << a["all_max_us_median"].get<double>() << " us median, "
                << a["all_max_us_p99"].get<double>() << " us p99; GradScaler iteration "
                << std::setprecision(3) << a["loop_ms_without_ranks"].get<double>() << " ms alone, "
                << a["loop_ms_with_ranks"].get<double>() << " ms with ranks\n"
                << std::setprecision(1) << "  in the pipeline, riding in the gradient average "
                << "(1 MiB): " << a["average_1mib_us_median"].get<double>() << " us without, "
                << a["average_1mib_with_agreement_us_median"].get<double>()
                << " us with the agreement (medians)\n"
                << std::setprecision(3);
      for (const auto& e : j["exchange"])
        std::cout << std::setprecision(0) << "  " << e["bytes"].get<std::int64_t>() / 1024
                  << " KiB of gradients (medians): bucket all-reduced "
                  << e["allreduce_us_median"].get<double>() << " us, average (rank order) "
                  << e["average_us_median"].get<double>() << " us, reduce_scatter "
                  << e["reduce_scatter_us_median"].get<double>() << " us\n"
                  << std::setprecision(3);
      for (const auto& p : j["pipeline"])
        std::cout << "  pipeline, staleness " << p["staleness"].get<int>() << " ("
                  << p["params"].get<std::int64_t>() << " params): iteration "
                  << p["iteration_ms"].get<double>() << " ms, trainer waits "
                  << p["trainer_wait_ms"].get<double>() << " ms, gradient average "
                  << p["grad_average_ms"].get<double>() << " ms on the optimizer thread\n";
    }
    if (!json.empty())
      std::ofstream(json) << nlohmann::json({{"floor", floor},
                                             {"runs", all},
                                             {"setup", ampactor::bench::run_setup()}})
                                 .dump(2);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "ampactor-bench-dist: " << e.what() << "\n";
    return 1;
  }
}
