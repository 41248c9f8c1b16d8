// A run watched in the tools people already read: one record per iteration (the scale, skips,
// overflowing gradients, the gradient norm, the trainer's wait, the step time) as JSON lines and
// CSV, TensorBoard event files and a Prometheus endpoint, beside the keeper's trace.
//   watch_metrics [OUT_DIR]   then: tensorboard --logdir OUT_DIR/tensorboard
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/keeper/taps.h>
#include <ampactor/metrics/metrics.h>
#include <ampactor/optim/fused.h>
#include <ampactor/pipeline/async_optimizer.h>
#include <ampactor/trace/trace.h>
#ifdef AMPACTOR_EXAMPLE_TENSORBOARD
#include <ampactor/metrics/tensorboard.h>
#endif
#ifdef AMPACTOR_EXAMPLE_PROMETHEUS
#include <ampactor/metrics/prometheus.h>
#endif
#include <torch/torch.h>

#include <filesystem>
#include <iostream>

int main(int argc, char** argv) {
  const std::string out = argc > 1 ? argv[1] : "out/watch";
  std::filesystem::create_directories(out);
  auto metrics = std::make_shared<ampactor::Metrics>();
  metrics->sink(std::make_shared<ampactor::JsonlMetrics>(out + "/metrics.jsonl"))
      .sink(std::make_shared<ampactor::CsvMetrics>(out + "/metrics.csv"));
#ifdef AMPACTOR_EXAMPLE_TENSORBOARD
  metrics->sink(std::make_shared<ampactor::TensorBoardMetrics>(out + "/tensorboard"));
#endif
#ifdef AMPACTOR_EXAMPLE_PROMETHEUS
  auto prometheus = std::make_shared<ampactor::PrometheusMetrics>("127.0.0.1:0");
  metrics->sink(prometheus);
  std::cout << "metrics at http://127.0.0.1:" << prometheus->port() << "/metrics\n";
#endif
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(16, 32), torch::nn::Tanh(),
                              torch::nn::Linear(32, 1));
  const at::Tensor x = torch::randn({256, 16}), y = x.sum(1, /*keepdim=*/true).sin();
  {
    // The keeper's tap: the metrics and a trace, side by side. The pipeline's tap: the metrics.
    auto trace = ampactor::record_trace(out + "/trace.jsonl");
    ampactor::GradScaler scaler(
        ampactor::GradScalerOptions().growth_interval(20),
        ampactor::KeeperOptions().tap(ampactor::tee_taps({trace, metrics})));
    ampactor::AsyncOptimizer pipe(
        model->parameters(), scaler,
        ampactor::AsyncOptimizerOptions().staleness(0).clip_grad_norm(1.0).tap(metrics));
    pipe.name_parameters(model->named_parameters());
    auto& opt = pipe.make_optimizer<ampactor::optim::FusedAdamW>(torch::optim::AdamWOptions(1e-2));
    for (int step = 0; step < 100; ++step) {
      scaler.scale(torch::mse_loss(model->forward(x), y)).backward();
      pipe.step(opt, [&] { scaler.step(opt); });
      scaler.update();
      model->zero_grad();
    }
  }  // the scaler's keeper stops: the last records are written, the files closed
  std::cout << metrics->written() << " records in " << out << "\n";
  return metrics->written() == 100 && metrics->failure().empty() ? 0 : 1;
}
