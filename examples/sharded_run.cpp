// Data parallel with the optimizer's state sharded across the ranks: each rank keeps and steps
// 1/N of the masters and of AdamW's moments, and an all-gather gives every rank's model the whole
// update. Every 20 steps the ranks save the run together (each its shard, rank 0 the manifest
// that names them); a run that finds a save goes on from it (--resume: one must be there). Here:
//   ampactor-launch --nproc 2 -- ./sharded_run --steps 40
//   ampactor-launch --nproc 2 -- ./sharded_run --steps 60 --resume
// On two machines, the same on each, with --nnodes 2 --node-rank R --master-addr A. On another
// number of ranks, re-shard the save first:
//   ampactor-ckpt reshard sharded_run.ckpt --world M run-M
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/distributed/dist.h>
#include <ampactor/optim/fused.h>
#include <ampactor/pipeline/async_optimizer.h>
#include <ampactor/run/run.h>

#include <torch/torch.h>

#include <iomanip>
#include <iostream>
#include <string>

int main(int argc, char** argv) try {
  int steps = 60;
  bool resume = false;
  std::string ckpt = "sharded_run.ckpt";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--resume") {
      resume = true;
    } else if (a == "--steps" && i + 1 < argc) {
      steps = std::stoi(argv[++i]);
    } else if (a == "--ckpt" && i + 1 < argc) {
      ckpt = argv[++i];
    } else {
      std::cerr << "usage: sharded_run [--steps N] [--ckpt PATH] [--resume]\n";
      return 2;
    }
  }
  ampactor::dist::World world = ampactor::dist::init_from_env();
  const int rank = world.launch.rank, ranks = world.launch.world_size;

  torch::manual_seed(0);  // the same initial weights on every rank
  torch::nn::Sequential model(torch::nn::Linear(32, 64), torch::nn::Tanh(),
                              torch::nn::Linear(64, 1));
  ampactor::GradScaler scaler(ampactor::GradScalerOptions().init_scale(1024).ranks(world.ranks));
  // Each rank's masters are its shard; swap_weights takes the weights' all-gather off the
  // trainer's path (the step's job gathers into a second buffer, the next step swaps it in).
  ampactor::AsyncOptimizer pipe(
      model->parameters(), scaler,
      ampactor::AsyncOptimizerOptions().shard_optimizer_state(true).swap_weights(true));
  auto& opt = pipe.make_optimizer<ampactor::optim::FusedAdamW>(torch::optim::AdamWOptions(1e-2));
  const auto run =
      ampactor::RunParts().model(model.get()).optimizer(&opt).scaler(&scaler).pipeline(&pipe);
  // Every rank loads, and saves, together: rank 0 reads the manifest, each rank its shard.
  const int first =
      int(resume ? ampactor::load_run(ckpt, run) : ampactor::resume_run(ckpt, run)) + 1;

  torch::manual_seed(1);
  const at::Tensor w_true = torch::randn({32, 1});
  for (int step = first; step < steps; ++step) {
    // The global batch of 256 is the same on every rank; each takes its part.
    torch::manual_seed(1000 + step);
    const at::Tensor x = torch::randn({256, 32}).chunk(ranks)[rank];
    at::Tensor loss = (model->forward(x) - x.matmul(w_true)).pow(2).mean();
    if (step == 30 && rank == ranks - 1) loss = loss * INFINITY;  // one rank overflows: all skip
    model->zero_grad();
    scaler.scale(loss).backward();
    pipe.step(opt, [&] { scaler.step(opt); });
    scaler.update();
    if ((step + 1) % 20 == 0) ampactor::save_run(ckpt, run, step);
  }
  pipe.sync();
  // The model's weights are the same on every rank; the masters are this rank's shard.
  double sum = 0;
  std::int64_t mine = 0, all = 0;
  for (const auto& p : model->parameters())
    sum += p.sum().item<double>(), all += p.numel();
  for (const auto& m : pipe.optim_parameters())
    mine += m.numel();
  std::cout << "rank " << rank << " of " << ranks << ": steps " << first << " to " << steps
            << ", scale " << scaler.get_scale() << ", weight sum " << std::setprecision(17) << sum
            << ", masters " << mine << " of " << all << "\n";
  return 0;
} catch (const ampactor::ScalerError& e) {
  // Said, and told to torchrun's summary where it runs this; an exit code, not an abort.
  std::cerr << "sharded_run: " << e.what() << std::endl;
  ampactor::dist::report_failure(e.what());
  return 1;
}
