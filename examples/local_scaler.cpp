// A LibTorch training loop with ampactor::LocalGradScaler, torch.amp.GradScaler's C++ twin:
// scale the loss, unscale_ before clipping, step (skipped on inf/NaN), update.
#include <ampactor/scaler/local_grad_scaler.h>
#include <ampactor/version.h>
#include <torch/torch.h>

#include <iostream>

int main() {
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(16, 32), torch::nn::Tanh(),
                              torch::nn::Linear(32, 1));
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05));
  ampactor::LocalGradScaler scaler(ampactor::GradScalerOptions().init_scale(1024));

  const at::Tensor x = torch::randn({256, 16}), y = x.sum(1, /*keepdim=*/true).sin();
  int skipped = 0;
  for (int step = 0; step < 200; ++step) {
    opt.zero_grad();
    at::Tensor loss = torch::mse_loss(model->forward(x), y);
    if (step == 100) loss = loss * INFINITY;  // an overflow: this step is skipped
    scaler.scale(loss).backward();
    scaler.unscale_(opt);  // the grads are true-sized now: clip them
    torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    skipped += !scaler.step(opt).has_value();
    scaler.update();
    if (step % 50 == 0 || step == 199)
      std::cout << "step " << step << "  loss " << loss.item<float>() << "  scale "
                << scaler.get_scale() << "\n";
  }
  std::cout << "ampactor " << AMPACTOR_VERSION_STRING << ": " << skipped
            << " step(s) skipped, final scale " << scaler.get_scale() << "\n";
  return skipped == 1 ? 0 : 1;
}
