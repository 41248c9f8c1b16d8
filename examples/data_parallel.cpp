// Data-parallel training: N ranks, each on its own shard of every batch, stepping or skipping
// together with one scale. Run 2 ranks on this machine with
//   ampactor-launch --nproc 2 -- ./data_parallel
// (or torchrun's variables set by hand: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
#include <ampactor/actors/async_optimizer.h>
#include <ampactor/actors/checkpoint.h>
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/distributed/dist.h>

#include <torch/torch.h>

#include <iomanip>
#include <iostream>

int main() {
  // RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT come from the launcher.
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

  const at::Tensor w_true = torch::randn({32, 1});
  for (int step = 0; step < 60; ++step) {
    // The global batch of 256 is the same on every rank; each takes its shard.
    torch::manual_seed(1000 + step);
    const at::Tensor x = torch::randn({256, 32}).chunk(ranks)[rank];
    at::Tensor loss = (model->forward(x) - x.matmul(w_true)).pow(2).mean();
    if (step == 30 && rank == ranks - 1) loss = loss * INFINITY;  // one rank overflows: all skip
    model->zero_grad();
    scaler.scale(loss).backward();
    pipe.step(opt, [&] { scaler.step(opt); });
    scaler.update();
  }
  // Every rank holds the same run, so one writes the checkpoint; every rank loads it to resume
  // (ampactor::load_run). Ranks writing one path all the same would be safe, and wasted work.
  if (rank == 0)
    ampactor::save_run(
        "data_parallel.pt",
        ampactor::RunParts().model(model.get()).optimizer(&opt).scaler(&scaler).pipeline(&pipe),
        60);
  pipe.sync();
  double sum = 0;
  for (const auto& p : pipe.optim_parameters())
    sum += p.sum().item<double>();
  int skipped = 0;
  for (int step = 0; step < 60; ++step)
    skipped += scaler.wait_result(step).skipped();
  std::cout << "rank " << rank << " of " << ranks << ": " << skipped << " step(s) skipped, scale "
            << scaler.get_scale() << ", parameter sum " << std::setprecision(17) << sum
            << std::endl;
  return 0;
}
