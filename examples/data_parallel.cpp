// Data-parallel training: N ranks, each on its own shard of every batch, stepping or skipping
// together with one scale. Run 2 ranks on this machine with
//   ampactor-launch --nproc 2 -- ./data_parallel
// or under torchrun, mpirun or srun (doc/guide/data-parallel.md). Every 20 steps one rank a host
// saves the run; a restart finds the checkpoint and resumes from it.
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/distributed/dist.h>
#include <ampactor/pipeline/async_optimizer.h>
#include <ampactor/run/run.h>

#include <torch/torch.h>

#include <iomanip>
#include <iostream>
#include <string>

int main(int argc, char** argv) try {
  int steps = 60;
  std::string ckpt = "data_parallel.ckpt.pt";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc) {
      steps = std::stoi(argv[++i]);
    } else if (a == "--ckpt" && i + 1 < argc) {
      ckpt = argv[++i];
    } else {
      std::cerr << "usage: data_parallel [--steps N] [--ckpt PATH]\n";
      return 2;
    }
  }
  // The rank, the world size and the store's address come from the launcher.
  ampactor::dist::World world = ampactor::dist::init_from_env();
  const int rank = world.launch.rank, ranks = world.launch.world_size;

  torch::manual_seed(0);  // the same initial weights on every rank
  torch::nn::Sequential model(torch::nn::Linear(32, 64), torch::nn::Tanh(),
                              torch::nn::Linear(64, 1));
  // One scale for all ranks: each unscale's found_inf is agreed across them.
  ampactor::GradScaler scaler(ampactor::GradScalerOptions().init_scale(1024).ranks(world.ranks));
  // The grad move averages the gradients across the ranks on the optimizer thread, overlapped
  // with the next forward and backward.
  ampactor::AsyncOptimizer pipe(
      model->parameters(), scaler,
      ampactor::AsyncOptimizerOptions().swap_weights(true).defer_grad_move(true));
  // Owned by the pipeline: on a rank's error, its steps in flight end before the optimizer goes.
  auto& opt = pipe.make_optimizer<torch::optim::AdamW>(torch::optim::AdamWOptions(1e-2));
  const auto run =
      ampactor::RunParts().model(model.get()).optimizer(&opt).scaler(&scaler).pipeline(&pipe);
  // Every rank loads its host's copy, or none does; the ranks agree on the step first.
  const int first = int(ampactor::resume_run(ckpt, run)) + 1;

  torch::manual_seed(1);
  const at::Tensor w_true = torch::randn({32, 1});
  for (int step = first; step < steps; ++step) {
    // The global batch of 256 is the same on every rank; each takes its shard.
    torch::manual_seed(1000 + step);
    const at::Tensor x = torch::randn({256, 32}).chunk(ranks)[rank];
    at::Tensor loss = (model->forward(x) - x.matmul(w_true)).pow(2).mean();
    if (step == 30 && rank == ranks - 1) loss = loss * INFINITY;  // one rank overflows: all skip
    model->zero_grad();
    scaler.scale(loss).backward();
    pipe.step(opt, [&] { scaler.step(opt); });
    scaler.update();
    // Every rank holds the same run: one rank a host writes it, so each host has a copy.
    if ((step + 1) % 20 == 0 && world.launch.local_rank == 0) ampactor::save_run(ckpt, run, step);
  }
  pipe.sync();
  double sum = 0;
  for (const auto& p : pipe.optim_parameters())
    sum += p.sum().item<double>();
  int skipped = 0;
  for (int step = first; step < steps; ++step)
    skipped += scaler.wait_result(step).skipped();
  std::cout << "rank " << rank << " of " << ranks << ": steps " << first << " to " << steps << ", "
            << skipped << " step(s) skipped, scale " << scaler.get_scale() << ", parameter sum "
            << std::setprecision(17) << sum << std::endl;
  return 0;
} catch (const ampactor::ScalerError& e) {
  // Said, and told to torchrun's summary where it runs this; an exit code, not an abort.
  std::cerr << "data_parallel: " << e.what() << std::endl;
  ampactor::dist::report_failure(e.what());
  return 1;
}
