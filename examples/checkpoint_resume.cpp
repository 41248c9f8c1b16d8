// GradScaler + AsyncOptimizer: a model with fp16 weights, fp32 masters stepped on the optimizer
// thread, a checkpoint every N steps, and a resume that continues the run bit for bit.
//
//   checkpoint_resume [--steps 300] [--every 25] [--dir ckpt] [--optimizer adam|sgd]
//                     [--staleness 0|1] [--swap-defer]
//
// Run it, kill it (even with SIGKILL, even while it writes a checkpoint), run it again: it goes
// on from the last complete checkpoint, and its final line equals that of a run never killed.
#include <ampactor/actors/checkpoint.h>
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/pipeline/async_optimizer.h>
#include <ampactor/run/run.h>
#include <torch/torch.h>

#include <sys/stat.h>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
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

/// The command line.
struct Args {
  std::int64_t steps, every;
  std::string dir, kind;
  int staleness;
  bool swap_defer;
};

constexpr const char* usage =
    "usage: checkpoint_resume [--steps N>0] [--every N>0] [--dir D] "
    "[--optimizer adam|sgd] [--staleness 0|1] [--swap-defer]\n";

/// The options, or nothing when they make no run.
std::optional<Args> parse_args(int argc, char** argv) {
  Args a;
  a.steps = std::stoll(arg(argc, argv, "--steps", "300"));
  a.every = std::stoll(arg(argc, argv, "--every", "25"));
  a.dir = arg(argc, argv, "--dir", "ckpt");
  a.kind = arg(argc, argv, "--optimizer", "adam");
  a.staleness = std::stoi(arg(argc, argv, "--staleness", "1"));
  a.swap_defer = flag(argc, argv, "--swap-defer");
  if (a.steps < 1 || a.every < 1 || (a.kind != "adam" && a.kind != "sgd")) return std::nullopt;
  return a;
}

/// The same initial weights on every start; a resumed run then loads the checkpoint's.
std::shared_ptr<Net> seeded_net() {
  torch::manual_seed(0);
  return std::make_shared<Net>();
}

torch::optim::Optimizer* make_optimizer(ampactor::AsyncOptimizer& pipe, const std::string& kind) {
  if (kind == "adam")
    return &pipe.make_optimizer<torch::optim::Adam>(torch::optim::AdamOptions(1e-2));
  return &pipe.make_optimizer<torch::optim::SGD>(torch::optim::SGDOptions(0.02).momentum(0.9));
}

/// A run: the model, the scaler, the pipeline and the optimizer, built the same way on every
/// start, and the phases that use them.
struct Run {
  /// The pipeline owns the optimizer: on any way out, the steps in flight end before it goes
  /// (members go in reverse order: the pipeline before the scaler and the model).
  explicit Run(const Args& a)
      : args(a),
        path(a.dir + "/last.pt"),
        model(seeded_net()),
        scaler(ampactor::GradScalerOptions().growth_interval(20)),
        pipe(model->parameters(), scaler,
             ampactor::AsyncOptimizerOptions()
                 .staleness(a.staleness)
                 .swap_weights(a.swap_defer)
                 .defer_grad_move(a.swap_defer)),
        opt(make_optimizer(pipe, a.kind)) {}

  /// What a checkpoint holds.
  ampactor::RunParts parts() {
    return ampactor::RunParts().model(model.get()).optimizer(opt).scaler(&scaler).pipeline(&pipe);
  }

  /// Loads the last complete checkpoint, if there is one; the step to go on from (0 if none).
  std::int64_t resume() {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return 0;
    // The whole run or nothing: a damaged file, another model's or another optimizer's is
    // refused with a clear error before any part changes.
    const std::int64_t start = ampactor::load_run(path, parts());
    std::cout << "resumed from " << path << " at step " << start << ", scale " << scaler.get_scale()
              << std::endl;  // flushed: a run killed later still says where it started
    return start;
  }

  /// Trains from step `start` to `--steps`, with a checkpoint every `--every` steps and at the end.
  void train(std::int64_t start) {
    auto checkpoint = [&](std::int64_t done) {
      // The model, the optimizer, the scaler and the pipeline in one file, written atomically:
      // a kill mid-write leaves the previous one whole.
      ampactor::save_run(path, parts(), done);
    };

    const std::int64_t steps = args.steps, every = args.every;
    for (std::int64_t step = start; step < steps; ++step) {
      auto [x, y] = batch(step);
      torch::Tensor loss = torch::mse_loss(model->forward(x), y);
      if (step % 40 == 39) loss = loss * 1e6;  // a loss spike: its fp16 grads overflow, skipped
      scaler.scale(loss).backward();
      // The optimizer steps the masters on its own thread; with staleness 1 the next forward
      // overlaps it, on the weights of the step before.
      pipe.step(*opt, [&] { scaler.step(*opt); });
      if (!args.swap_defer) model->zero_grad();  // defer_grad_move has taken the grads already
      scaler.update();
      if ((step + 1) % every == 0 || step + 1 == steps) checkpoint(step + 1);
      if (step % 50 == 0) std::cout << "step " << step << "  loss " << loss.item<float>() << "\n";
    }
  }

  /// The scaler's files, and the final line: eval loss, scale, tracker, digests of the weights
  /// and of the masters, equal for a resumed run and a run never killed.
  void finish() {
    pipe.sync();
    torch::save(scaler, args.dir + "/scaler.pt");  // the scaler alone, as torch::save(optimizer, f)
    // For Python: scaler.load_state_dict(torch.load(f)) on a torch.amp.GradScaler.
    ampactor::write_torch_state_dict(scaler.state_dict(), args.dir + "/scaler_state_dict.pt");
    auto [x, y] = batch(args.steps);
    std::printf("final: eval loss %.6f  scale %g  tracker %lld  weights %016llx  masters %016llx\n",
                torch::mse_loss(model->forward(x), y).item<float>(), scaler.get_scale(),
                static_cast<long long>(scaler.state_dict().get_int("_growth_tracker")),
                static_cast<unsigned long long>(digest(model->parameters())),
                static_cast<unsigned long long>(digest(pipe.optim_parameters())));
  }

  const Args args;
  const std::string path;  // the checkpoint
  std::shared_ptr<Net> model;
  ampactor::GradScaler scaler;
  ampactor::AsyncOptimizer pipe;
  torch::optim::Optimizer* opt;
};

}  // namespace

int main(int argc, char** argv) try {
  const std::optional<Args> args = parse_args(argc, argv);
  if (!args) {
    std::cerr << usage;
    return 2;
  }
  ::mkdir(args->dir.c_str(), 0755);

  Run run(*args);  // built the same way on every start
  const std::int64_t start = run.resume();
  run.train(start);
  run.finish();
  return 0;
} catch (const std::exception& e) {
  std::cerr << "checkpoint_resume: " << e.what() << "\n";
  return 1;
}
