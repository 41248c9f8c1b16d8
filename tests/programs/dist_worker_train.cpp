// ampactor-dist-worker's training run (dist_worker.h): the samples, the model, the optimizer and
// scaler of --path, the iterations with the faults asked for, and the lines the tests compare.
#include "dist_worker.h"

#include <ampactor/actors/checkpoint.h>
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/optim/fused.h>
#include <ampactor/pipeline/async_optimizer.h>
#include <ampactor/scaler/local_grad_scaler.h>
#include <ampactor/trace/trace.h>

#include <torch/nn/functional/activation.h>
#include <torch/nn/modules/container/functional.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include "dist_collectives.h"

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace dist_worker {
namespace {

/// Sample i of iteration k, the same on every rank and in --single: inputs and targets in
/// {-1, 0, 1} (a generator seeded by k and i alone).
std::pair<at::Tensor, at::Tensor> samples(int k, std::int64_t first, std::int64_t n) {
  at::Tensor x = at::empty({n, 8}), c = at::empty({n, 4});
  for (std::int64_t j = 0; j < n; ++j) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(std::uint64_t(k) * 1000003 +
                                                        std::uint64_t(first + j));
    x[j] = at::randint(-1, 2, {8}, gen).to(at::kFloat);
    c[j] = at::randint(-1, 2, {4}, gen).to(at::kFloat);
  }
  return {x, c};
}

/// The model, seeded alike on every rank.
torch::nn::Sequential make_net(const std::string& model, int width) {
  torch::manual_seed(7);
  torch::nn::Sequential net;
  if (model == "exact") {
    net->push_back(torch::nn::Linear(torch::nn::LinearOptions(8, 4).bias(false)));
    torch::NoGradGuard ng;
    for (auto& p : net->parameters())
      p.copy_(at::randint(-8, 9, p.sizes()).to(at::kFloat) / 8);
  } else if (width > 0) {  // a wider one, with a hidden layer of width x width
    net->push_back(torch::nn::Linear(8, width));
    net->push_back(torch::nn::Functional([](at::Tensor t) { return at::tanh(t); }));
    net->push_back(torch::nn::Linear(width, width));
    net->push_back(torch::nn::Functional([](at::Tensor t) { return at::tanh(t); }));
    net->push_back(torch::nn::Linear(width, 4));
  } else {
    net->push_back(torch::nn::Linear(8, 16));
    net->push_back(torch::nn::Functional([](at::Tensor t) { return at::tanh(t); }));
    net->push_back(torch::nn::Linear(16, 4));
  }
  return net;
}

/// The scaler's options of this rank.
ampactor::GradScalerOptions scaler_options(const Settings& s, int rank,
                                           const std::shared_ptr<ampactor::RankGroup>& ranks) {
  auto so = ampactor::GradScalerOptions();
  if (rank == 1 && !s.odd_rule.empty())
    so = ampactor::GradScalerOptions::preset(ampactor::rule_from_name(s.odd_rule).value());
  so.init_scale(s.init_scale).growth_interval(s.growth_interval).ranks(ranks);
  if (rank == 1 && s.odd_growth > 0) so.growth_factor(s.odd_growth);
  return so;
}

/// The optimizer and the scaler of --path. The optimizer first, so that it goes last: the scalers
/// and the pipeline finish their jobs before it goes, on any way out.
struct Stepper {
  std::unique_ptr<torch::optim::Optimizer> opt;
  std::unique_ptr<ampactor::LocalGradScaler> local;
  std::unique_ptr<ampactor::GradScaler> actor;
  std::unique_ptr<ampactor::AsyncOptimizer> pipe;
};

Stepper make_stepper(const Settings& s, int rank, torch::nn::Sequential& net,
                     const ampactor::GradScalerOptions& so) {
  const auto policy =
      s.policy == "lagged" ? ampactor::ScalePolicy::lagged : ampactor::ScalePolicy::exact;
  const std::string trace =
      s.trace.empty() ? "" : s.trace + ".rank" + std::to_string(rank) + ".jsonl";
  Stepper st;
  const auto sgd = torch::optim::SGDOptions(1.0 / 64).momentum(0.5);
  if (s.path == "local") {
    st.local = std::make_unique<ampactor::LocalGradScaler>(so);
    st.opt = std::make_unique<torch::optim::SGD>(net->parameters(), sgd);
  } else {
    st.actor = std::make_unique<ampactor::GradScaler>(
        so, policy, trace.empty() ? nullptr : ampactor::record_trace(trace));
    if (s.path == "pipeline") {
      auto o = ampactor::AsyncOptimizerOptions()
                   .staleness(s.staleness)
                   .swap_weights(s.defer || s.swap)
                   .defer_grad_move(s.defer || s.defer_move)
                   .overlap_backward(s.overlap)
                   .bucket_bytes(s.bucket_bytes)
                   .shard_optimizer_state(s.shard || (rank == 1 && s.odd_shard))
                   .shard_replicas(s.replicas == "off"     ? ampactor::ShardReplicas::off
                                   : s.replicas == "buddy" ? ampactor::ShardReplicas::buddy
                                                           : ampactor::ShardReplicas::automatic);
      if (s.clip > 0) o.clip_grad_norm(s.clip);
      if (s.cuda) o.master_device(at::Device(at::kCPU));
      st.pipe = std::make_unique<ampactor::AsyncOptimizer>(net->parameters(), *st.actor, o);
      const auto adam = torch::optim::AdamOptions(1.0 / 256);
      if (s.adam && s.fused)
        st.opt = std::make_unique<ampactor::optim::FusedAdam>(st.pipe->optim_parameters(), adam);
      else if (s.adam)
        st.opt = std::make_unique<torch::optim::Adam>(st.pipe->optim_parameters(), adam);
      else if (s.fused)
        st.opt = std::make_unique<ampactor::optim::FusedSGD>(st.pipe->optim_parameters(), sgd);
      else
        st.opt = std::make_unique<torch::optim::SGD>(st.pipe->optim_parameters(), sgd);
    } else {
      st.opt = std::make_unique<torch::optim::SGD>(net->parameters(), sgd);
    }
  }
  return st;
}

/// This rank's training run, writing its lines into `out`.
struct Worker {
  const Settings& s;
  int rank, shards;
  const std::shared_ptr<ampactor::RankGroup>& ranks;
  torch::nn::Sequential& net;
  Stepper& st;
  std::ostream& out;
  std::int64_t taken = 0;  // overlap: masters a step took from the second buffer (a swap)

  /// A trainer of one's own: it averages the gradients itself.
  void average_grads() {
    std::vector<at::Tensor> g;
    for (auto& p : net->parameters())
      g.push_back(p.grad());
    if (ranks) ranks->average(g);
  }

  /// Iteration k's loss, with the infs asked for.
  at::Tensor loss(int k) {
    const std::int64_t n = s.batch * (s.single > 0 ? shards : 1);
    auto [x, c] = samples(k, s.single > 0 ? 0 : rank * s.batch, n);
    if (s.cuda) x = x.cuda(), c = c.cuda();
    net->zero_grad();
    at::Tensor y = net->forward(x);
    at::Tensor loss = s.model == "exact" ? (y * c).sum() / double(n) : (y - c).pow(2).mean();
    for (int r = 0; r < shards; ++r)
      if (s.inf_at.count({s.single > 0 ? r : rank, k}) && (s.single > 0 || r == 0))
        loss = loss * INFINITY;
    return loss;
  }

  void step_local(int k, const at::Tensor& loss) {
    st.local->scale(loss).backward();
    const double scale = st.local->get_scale();
    average_grads();
    st.local->step(*st.opt);
    out << k << " " << scale << " " << *st.local->found_inf(*st.opt) << "\n";
    st.local->update();
  }

  void step_actor(int k, const at::Tensor& loss) {
    const bool throws = s.throw_at.count({rank, k}) > 0;
    st.actor->scale(loss).backward();
    const double scale = st.actor->get_scale();
    // The scaler's own count (a resumed run's scaler counts from 0 again).
    const ampactor::iteration_t it = st.actor->iteration();
    auto fn = [&] {
      if (throws) throw std::runtime_error("an error in rank " + std::to_string(rank) + "'s step");
      st.actor->step(*st.opt);
    };
    if (st.pipe) {
      std::vector<const void*> where;
      for (const at::Tensor& m : st.pipe->optim_parameters())
        where.push_back(m.data_ptr());
      st.pipe->step(*st.opt, fn);
      for (std::size_t i = 0; i < where.size(); ++i)
        taken += st.pipe->optim_parameters()[i].data_ptr() != where[i];
    } else {
      average_grads();
      st.actor->submit(fn);
    }
    st.actor->update();
    out << k << " " << scale;
    if (st.pipe) st.pipe->sync();
    out << " " << st.actor->wait_result(it).skipped();
    if (st.pipe && s.clip > 0) out << " " << st.pipe->grad_norm();
    out << std::endl;  // whole lines, for a test that watches the run
  }

  /// Unsharded, each rank its own file (CKPT itself with --single); sharded, the manifest.
  std::string ckpt() const {
    return s.shard || s.single > 0 ? s.ckpt : s.ckpt + ".rank" + std::to_string(rank) + ".pt";
  }
  ampactor::RunParts parts() const {
    return ampactor::RunParts()
        .model(net.get())
        .optimizer(st.opt.get())
        .scaler(st.actor.get())
        .pipeline(st.pipe.get());
  }

  std::chrono::steady_clock::duration save_time{};
  int saves = 0;

  void train() {
    int first = 0;
    if (s.resume) first = int(ampactor::load_run(ckpt(), parts())) + 1;
    if (s.resume_any) first = int(ampactor::resume_run(ckpt(), parts())) + 1;
    for (int k = first; k < s.steps; ++k) {
      if (s.die_at.count({rank, k})) std::raise(SIGKILL);
      if (s.stop_at.count({rank, k})) std::raise(SIGSTOP);
      const at::Tensor l = loss(k);
      if (st.local)
        step_local(k, l);
      else
        step_actor(k, l);
      if (k == s.save_at || (s.save_every > 0 && (k + 1) % s.save_every == 0)) {
        const auto t0 = std::chrono::steady_clock::now();
        ampactor::save_run(ckpt(), parts(), k);
        save_time += std::chrono::steady_clock::now() - t0;
        ++saves;
      }
      if (s.step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(s.step_ms));
    }
    if (st.pipe) st.pipe->sync();
    if (s.time_saves)
      std::cerr << "save-time rank " << rank << ": " << saves << " saves, "
                << std::chrono::duration<double, std::milli>(save_time).count() << " ms\n";
  }

  /// The "param" lines: each parameter's floats in hex (the masters, with a pipeline).
  void write_params() {
    int i = 0;
    for (auto& p : (st.pipe && !s.print_model ? st.pipe->optim_parameters() : net->parameters())) {
      out << "param " << i++;
      const at::Tensor t = p.detach().cpu().contiguous();
      for (std::int64_t j = 0; j < t.numel(); ++j) {
        char hex[32];
        std::snprintf(hex, sizeof hex, " %a", double(t.data_ptr<float>()[j]));
        out << hex;
      }
      out << "\n";
    }
  }
};

}  // namespace

/// The run of this rank, once the group is up.
void run(Settings& s, int rank, int shards, std::shared_ptr<ampactor::RankGroup> group) {
  if (s.path == "collectives") {
    std::ofstream out(s.out + "/rank" + std::to_string(rank) + ".txt");
    ampactor::test::check_collectives(*group, out);
    out << "done\n";
    return;
  }
  // Counted: which gradient collectives the pipeline made is printed with --print-model.
  auto counted = group ? std::make_shared<ampactor::test::CountingRanks>(group) : nullptr;
  const std::shared_ptr<ampactor::RankGroup> ranks = counted;
  if (rank == 1 && s.odd_interval > 0) s.growth_interval = s.odd_interval;
  if (rank == 1 && !s.odd_policy.empty()) s.policy = s.odd_policy;
  torch::nn::Sequential net = make_net(s.model, s.width);
  if (s.cuda) net->to(torch::kCUDA);
  if (rank == 1 && s.odd_init_scale > 0) s.init_scale = s.odd_init_scale;
  Stepper st = make_stepper(s, rank, net, scaler_options(s, rank, ranks));
  std::ofstream out(s.out + "/rank" + std::to_string(rank) + ".txt");
  Worker worker{s, rank, shards, ranks, net, st, out};
  worker.train();
  // The newest overflow as this rank's scaler reports it, with the ranks that found it.
  if (s.print_overflow && !st.local)
    if (auto o = st.actor->last_overflow()) {
      out << "last_overflow " << o->iteration << " ranks";
      for (auto r : o->ranks)
        out << " " << r;
      out << "\n";
    }
  worker.write_params();
  // The masters this rank keeps (with --shard, its shard's).
  if (s.print_model && st.pipe) {
    std::int64_t n = 0;
    for (const auto& m : st.pipe->optim_parameters())
      n += m.numel();
    out << "masters " << n << "\n";
    if (counted)
      out << "collectives average " << counted->averages << " reduce_scatter "
          << counted->reduce_scatters << "\n";
  }
  // The second buffers' size: nonzero once a bucket was stepped during backward.
  // and the speculative steps taken.
  if (s.overlap)
    out << "overlap_bytes " << st.pipe->overlap_bytes() << " taken " << worker.taken << "\n";
  out << "done\n";
}

}  // namespace dist_worker
