// GradScaler + AsyncOptimizer: a model with fp16 weights, fp32 masters stepped on the optimizer
// thread, a checkpoint every N steps, and a resume that continues the run bit for bit.
//
//   checkpoint_resume [--steps 300] [--every 25] [--dir ckpt] [--optimizer adam|sgd]
//                     [--staleness 0|1] [--swap-defer]
//
// Run it, kill it (even with SIGKILL, even while it writes a checkpoint), run it again: it goes
// on from the last complete checkpoint, and its final line equals that of a run never killed.
#include <ampactor/async_optimizer.h>
#include <ampactor/checkpoint.h>
#include <ampactor/grad_scaler.h>
#include <torch/torch.h>

#include <sys/stat.h>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <string>

namespace {

/// Two layers whose weights are stored in fp16. LibTorch's CPU kernels have no fp16 matmul, so
/// the forward casts them to fp32 (the casts' backward hands fp16 grads back, as autocast would);
/// on a GPU, compute in fp16 instead.
struct Net : torch::nn::Module {
  Net() {
    w1 = register_parameter("w1", (torch::randn({16, 64}) * 0.25).to(torch::kHalf));
    b1 = register_parameter("b1", torch::zeros({64}, torch::kHalf));
    w2 = register_parameter("w2", (torch::randn({64, 1}) * 0.125).to(torch::kHalf));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::tanh(x.matmul(w1.to(torch::kFloat)) + b1.to(torch::kFloat))
        .matmul(w2.to(torch::kFloat));
  }
  torch::Tensor w1, b1, w2;
};

/// Step `step`'s batch: a function of the step alone, so a resumed run sees the same data.
std::pair<torch::Tensor, torch::Tensor> batch(std::int64_t step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  torch::Tensor x = torch::randn({64, 16}, gen);
  return {x, torch::tanh(0.25 * x.sum(1, /*keepdim=*/true))};
}

/// FNV-1a over the tensors' bytes: equal digests mean equal bits.
std::uint64_t digest(const std::vector<torch::Tensor>& ts) {
  std::uint64_t h = 1469598103934665603ull;
  for (const torch::Tensor& t : ts) {
    const torch::Tensor c = t.detach().contiguous();
    const auto* p = static_cast<const unsigned char*>(c.data_ptr());
    for (std::size_t i = 0; i < c.nbytes(); ++i)
      h = (h ^ p[i]) * 1099511628211ull;
  }
  return h;
}

std::string arg(int argc, char** argv, const std::string& name, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == name) return argv[i + 1];
  return fallback;
}

bool flag(int argc, char** argv, const std::string& name) {
  for (int i = 1; i < argc; ++i)
    if (argv[i] == name) return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) try {
  const std::int64_t steps = std::stoll(arg(argc, argv, "--steps", "300"));
  const std::int64_t every = std::stoll(arg(argc, argv, "--every", "25"));
  const std::string dir = arg(argc, argv, "--dir", "ckpt");
  const std::string kind = arg(argc, argv, "--optimizer", "adam");
  const int staleness = std::stoi(arg(argc, argv, "--staleness", "1"));
  const bool swap_defer = flag(argc, argv, "--swap-defer");
  if (steps < 1 || every < 1 || (kind != "adam" && kind != "sgd")) {
    std::cerr << "usage: checkpoint_resume [--steps N>0] [--every N>0] [--dir D] "
                 "[--optimizer adam|sgd] [--staleness 0|1] [--swap-defer]\n";
    return 2;
  }
  ::mkdir(dir.c_str(), 0755);
  const std::string path = dir + "/last.pt";

  torch::manual_seed(0);
  auto model = std::make_shared<Net>();
  ampactor::GradScaler scaler(ampactor::GradScalerOptions().growth_interval(20));
  ampactor::AsyncOptimizer pipe(model->parameters(), scaler,
                                ampactor::AsyncOptimizerOptions()
                                    .staleness(staleness)
                                    .swap_weights(swap_defer)
                                    .defer_grad_move(swap_defer));
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (kind == "adam")
    opt = std::make_unique<torch::optim::Adam>(pipe.optim_parameters(),
                                               torch::optim::AdamOptions(1e-2));
  else
    opt = std::make_unique<torch::optim::SGD>(pipe.optim_parameters(),
                                              torch::optim::SGDOptions(0.02).momentum(0.9));
  ampactor::FinishJobs finish(scaler);  // on any way out, the steps in flight end before opt goes

  std::int64_t start = 0;
  if (struct stat st; ::stat(path.c_str(), &st) == 0) {
    // One archive holds the model, the optimizer, the scaler and the pipeline.
    torch::serialize::InputArchive all, m, o, s, p;
    ampactor::load_checkpoint(all, path);  // a damaged file: a clear error, nothing changed
    all.read("model", m), all.read("optimizer", o), all.read("scaler", s), all.read("pipeline", p);
    model->load(m), opt->load(o), scaler.load(s), pipe.load(p);
    c10::IValue step;
    all.read("step", step);
    start = step.toInt();
    std::cout << "resumed from " << path << " at step " << start << ", scale " << scaler.get_scale()
              << std::endl;  // flushed: a run killed later still says where it started
  }

  auto checkpoint = [&](std::int64_t done) {
    torch::serialize::OutputArchive all;
    torch::serialize::OutputArchive m(all.compilation_unit()), o(all.compilation_unit()),
        s(all.compilation_unit()), p(all.compilation_unit());
    pipe.save(p);  // first: it waits for the step in flight, so the optimizer holds still
    model->save(m), opt->save(o), scaler.save(s);
    all.write("step", c10::IValue(done));
    all.write("model", m), all.write("optimizer", o), all.write("scaler", s);
    all.write("pipeline", p);
    ampactor::save_atomically(all, path);  // a kill mid-write leaves the previous one whole
  };

  for (std::int64_t step = start; step < steps; ++step) {
    auto [x, y] = batch(step);
    torch::Tensor loss = torch::mse_loss(model->forward(x), y);
    if (step % 40 == 39) loss = loss * 1e6;  // a loss spike: its fp16 grads overflow, skipped
    scaler.scale(loss).backward();
    // The optimizer steps the masters on its own thread; with staleness 1 the next forward
    // overlaps it, on the weights of the step before.
    pipe.step(*opt, [&] { scaler.step(*opt); });
    if (!swap_defer) model->zero_grad();  // defer_grad_move has taken the grads already
    scaler.update();
    if ((step + 1) % every == 0 || step + 1 == steps) checkpoint(step + 1);
    if (step % 50 == 0) std::cout << "step " << step << "  loss " << loss.item<float>() << "\n";
  }
  pipe.sync();
  torch::save(scaler, dir + "/scaler.pt");  // the scaler alone, as torch::save(optimizer, f)
  // For Python: scaler.load_state_dict(torch.load(f)) on a torch.amp.GradScaler.
  ampactor::write_torch_state_dict(scaler.state_dict(), dir + "/scaler_state_dict.pt");
  auto [x, y] = batch(steps);
  std::printf("final: eval loss %.6f  scale %g  tracker %lld  weights %016llx  masters %016llx\n",
              torch::mse_loss(model->forward(x), y).item<float>(), scaler.get_scale(),
              static_cast<long long>(scaler.state_dict().get_int("_growth_tracker")),
              static_cast<unsigned long long>(digest(model->parameters())),
              static_cast<unsigned long long>(digest(pipe.optim_parameters())));
  return 0;
} catch (const std::exception& e) {
  std::cerr << "checkpoint_resume: " << e.what() << "\n";
  return 1;
}
