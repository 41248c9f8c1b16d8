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
  // Named options, each a chainable setter (torch's positional order works too:
  // LocalGradScaler(init_scale, growth_factor, backoff_factor, growth_interval, enabled)).
  ampactor::LocalGradScaler scaler(
      ampactor::GradScalerOptions().init_scale(1024).growth_interval(100));
  const double g = scaler.options().growth_factor();  // 2: torch's default

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
  ampactor::StateDict sd = scaler.state_dict();  // torch's keys; load_state_dict takes it back
  std::cout << "ampactor " << AMPACTOR_VERSION_STRING << ": " << skipped
            << " step(s) skipped, final scale " << sd.get_double("scale") << ", growth factor " << g
            << "\n";
  return skipped == 1 ? 0 : 1;
}
