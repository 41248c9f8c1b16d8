// The asynchronous pipeline in brief: fp32 masters stepped by a fused AdamW on the optimizer
// thread while the trainer runs the next forward and backward on the weights of the step before.
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/optim/fused.h>
#include <ampactor/pipeline/async_optimizer.h>
#include <torch/torch.h>

#include <iostream>

int main() {
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(16, 32), torch::nn::Tanh(),
                              torch::nn::Linear(32, 1));
  const at::Tensor x = torch::randn({256, 16}), y = x.sum(1, /*keepdim=*/true).sin();
  ampactor::GradScaler scaler;
  const auto o = ampactor::AsyncOptimizerOptions().optimizer_threads(1).swap_weights(true);
  ampactor::AsyncOptimizer pipe(model->parameters(), scaler, o);
  auto& opt = pipe.make_optimizer<ampactor::optim::FusedAdamW>(
      torch::optim::AdamWOptions(1e-2), ampactor::optim::FusedOptions().threads(1));
  for (int step = 0; step < 200; ++step) {
    scaler.scale(torch::mse_loss(model->forward(x), y)).backward();
    pipe.step(opt, [&] { scaler.step(opt); });  // takes the grads: the next backward makes new
    scaler.update();
  }
  pipe.sync();  // the model's weights are the newest step's
  const float loss = torch::mse_loss(model->forward(x), y).item<float>();
  std::cout << "loss " << loss << ", scale " << scaler.get_scale() << "\n";
  return loss < 0.1f ? 0 : 1;
}
