// The actor-backed GradScaler six ways: steps on the optimizer thread, asynchronous step jobs
// (submit), the asynchronous pipeline over fp32 masters, the same with a fused optimizer, the
// overlapped backward (exact, with micro-batches), a recorded trace; and, where a CUDA device
// is, an fp16 model on the GPU with its masters and optimizer on the CPU.
//
//   async_steps [TRACE_PATH]    (default run.jsonl; replay it with ampactor-replay TRACE_PATH)
#include <ampactor/actors/grad_scaler.h>
#include <ampactor/optim/fused.h>
#include <ampactor/pipeline/async_optimizer.h>
#include <ampactor/trace/trace.h>  // link ampactor::trace
#include <torch/torch.h>

#include <iostream>
#include <string>
#include <vector>

namespace {

struct Batch {
  at::Tensor x, y;
};

std::vector<Batch> make_data() {
  std::vector<Batch> data;
  for (int i = 0; i < 40; ++i) {
    at::Tensor x = torch::randn({64, 16});
    data.push_back({x, torch::tanh(0.25 * x.sum(1, /*keepdim=*/true))});
  }
  return data;
}

torch::nn::Sequential make_model() {
  return torch::nn::Sequential(torch::nn::Linear(16, 32), torch::nn::Tanh(),
                               torch::nn::Linear(32, 1));
}

at::Tensor loss_fn(const at::Tensor& out, const at::Tensor& y) {
  return torch::mse_loss(out.to(at::kFloat), y);
}

double eval(torch::nn::Sequential& model, const std::vector<Batch>& data) {
  torch::NoGradGuard no_grad;
  return loss_fn(model->forward(data[0].x.to(model->parameters()[0].options())),
                 data[0].y.to(model->parameters()[0].device()))
      .item<double>();
}

/// scaler.step() queued on the optimizer thread and waited for.
double steps_on_the_optimizer_thread(const std::vector<Batch>& data) {
  auto model = make_model();
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  ampactor::GradScaler scaler;  // owns a small actor system; or GradScaler(sys, opts, keeper)
  for (auto& batch : data) {
    optimizer.zero_grad();
    scaler.scale(loss_fn(model->forward(batch.x), batch.y)).backward();
    scaler.step(optimizer);  // queued on the optimizer thread, waited for
    scaler.update();         // never waits for the optimizer
  }
  return eval(model, data);
}

/// submit(): the step job runs with the scale its gradients were made with.
double asynchronous_step_jobs(const std::vector<Batch>& data) {
  auto model = make_model();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  ampactor::GradScaler scaler;
  for (auto& batch : data) {
    opt.zero_grad();
    scaler.scale(loss_fn(model->forward(batch.x), batch.y)).backward();
    scaler.submit([&] {
      scaler.unscale_(opt);  // true-sized grads, then clip
      torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
      scaler.step(opt);
    });
    scaler.update();
    scaler.sync();  // fn wrote the model's weights: the next forward must wait for it
  }
  return eval(model, data);
}

/// AsyncOptimizer: the optimizer steps fp32 masters while the next forward/backward runs.
double the_pipeline(const std::vector<Batch>& data) {
  auto model = make_model();
  ampactor::GradScaler scaler;
  const auto o = ampactor::AsyncOptimizerOptions()
                     .optimizer_threads(1)    // when the trainer uses the other cores
                     .swap_weights(true)      // with defer_grad_move, step() waits only for
                     .defer_grad_move(true);  // the last step and a swap
  ampactor::AsyncOptimizer pipe(model->parameters(), scaler, o);
  // The pipeline owns the optimizer: on any way out, the steps in flight end before it goes.
  auto& opt = pipe.make_optimizer<torch::optim::AdamW>(torch::optim::AdamWOptions(1e-2));
  for (auto& batch : data) {
    model->zero_grad();
    scaler.scale(loss_fn(model->forward(batch.x), batch.y)).backward();
    pipe.step(opt, [&] { scaler.step(opt); });
    scaler.update();
  }
  pipe.sync();
  return eval(model, data);
}

/// The pipeline with a fused optimizer: no grad move; the step reads the model's grads, unscales
/// them, skips on inf/NaN and writes the weights, in one pass per tensor.
double the_fused_pipeline(const std::vector<Batch>& data) {
  auto model = make_model();
  ampactor::GradScaler scaler;
  const auto o = ampactor::AsyncOptimizerOptions().optimizer_threads(1).swap_weights(true);
  ampactor::AsyncOptimizer pipe(model->parameters(), scaler, o);
  auto& opt = pipe.make_optimizer<ampactor::optim::FusedAdamW>(
      torch::optim::AdamWOptions(1e-2), ampactor::optim::FusedOptions().threads(1));
  for (auto& batch : data) {
    scaler.scale(loss_fn(model->forward(batch.x), batch.y)).backward();
    pipe.step(opt, [&] { scaler.step(opt); });  // takes the grads: the next backward makes new
    scaler.update();
  }
  pipe.sync();
  return eval(model, data);
}

/// Exact weights with the step overlapped: each bucket of parameters is stepped as soon as
/// backward has finished its gradients; step() commits (or, on an overflow, drops them all).
double the_overlapped_backward(const std::vector<Batch>& data) {
  auto model = make_model();
  ampactor::GradScaler scaler;
  const auto o = ampactor::AsyncOptimizerOptions()
                     .staleness(0)            // the weights of synchronous training
                     .overlap_backward(true)  // buckets stepped while backward goes on
                     .bucket_bytes(1024)      // small buckets for this small model
                     .clip_grad_norm(1.0);    // clip_grad_norm_(1.0) before every step
  ampactor::AsyncOptimizer pipe(model->parameters(), scaler, o);
  auto& opt = pipe.make_optimizer<ampactor::optim::FusedAdamW>(  // a fused optimizer: it can
      torch::optim::AdamWOptions(1e-2));                         // step into a second buffer
  for (std::size_t i = 0; i + 1 < data.size(); i += 2) {         // two micro-batches an iteration
    model->zero_grad();
    pipe.accumulate(true);  // the first micro-batch only accumulates
    scaler.scale(loss_fn(model->forward(data[i].x), data[i].y)).backward();
    pipe.accumulate(false);  // in the last one's backward the buckets become ready
    scaler.scale(loss_fn(model->forward(data[i + 1].x), data[i + 1].y)).backward();
    pipe.step(opt, [&] { scaler.step(opt); });  // waits for the last bucket, then swaps
    scaler.update();
  }
  return eval(model, data);
}

/// Every message to and from the scale keeper, recorded for ampactor-replay.
double a_recorded_run(const std::vector<Batch>& data, const std::string& path) {
  auto model = make_model();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  {
    ampactor::GradScaler scaler(ampactor::GradScalerOptions(),
                                ampactor::KeeperOptions().tap(ampactor::record_trace(path)));
    for (auto& batch : data) {
      opt.zero_grad();
      scaler.scale(loss_fn(model->forward(batch.x), batch.y)).backward();
      scaler.step(opt);
      scaler.update();
    }
  }  // the file is complete once the scaler is destroyed
  return eval(model, data);
}

/// RoundPipe's setting: an fp16 model on the GPU, fp32 masters and Adam on the CPU.
void the_model_on_the_gpu(const std::vector<Batch>& data) {
  if (!torch::cuda::is_available()) {
    std::cout << "GPU offload: no CUDA device here, skipped\n";
    return;
  }
  auto model = make_model();
  model->to(at::kCUDA, at::kHalf);
  ampactor::GradScaler scaler;
  ampactor::AsyncOptimizer pipe(model->parameters(), scaler,
                                ampactor::AsyncOptimizerOptions().master_device(at::kCPU));
  auto& opt = pipe.make_optimizer<torch::optim::Adam>(torch::optim::AdamOptions(1e-3));  // CPU
  for (auto& batch : data) {
    model->zero_grad();
    at::Tensor x = batch.x.to(at::kCUDA, at::kHalf), y = batch.y.to(at::kCUDA);
    scaler.scale(loss_fn(model->forward(x), y)).backward();
    pipe.step(opt, [&] { scaler.step(opt); });
    scaler.update();
  }
  pipe.sync();
  std::cout << "GPU offload: eval loss " << eval(model, data) << "\n";
}

/// The same with the overlapped backward: each bucket's grads leave the GPU and are stepped on
/// the CPU while backward goes on.
void the_overlapped_backward_on_the_gpu(const std::vector<Batch>& data) {
  if (!torch::cuda::is_available()) {
    std::cout << "GPU offload, overlapped backward: no CUDA device here, skipped\n";
    return;
  }
  auto model = make_model();
  model->to(at::kCUDA, at::kHalf);
  ampactor::GradScaler scaler;
  auto o = ampactor::AsyncOptimizerOptions()
               .staleness(0)
               .master_device(at::kCPU)  // the masters and the step on the CPU
               .overlap_backward(true)   // each bucket's grads leave the GPU when final
               .bucket_bytes(1024);      // small buckets for this small model
  ampactor::AsyncOptimizer pipe(model->parameters(), scaler, o);
  auto& opt = pipe.make_optimizer<ampactor::optim::FusedAdamW>(torch::optim::AdamWOptions(1e-3));
  for (auto& batch : data) {
    model->zero_grad();
    at::Tensor x = batch.x.to(at::kCUDA, at::kHalf), y = batch.y.to(at::kCUDA);
    scaler.scale(loss_fn(model->forward(x), y)).backward();
    pipe.step(opt, [&] { scaler.step(opt); });
    scaler.update();
  }
  pipe.sync();
  std::cout << "GPU offload, overlapped backward: eval loss " << eval(model, data) << "\n";
}

}  // namespace

int main(int argc, char** argv) try {
  const std::string trace = argc > 1 ? argv[1] : "run.jsonl";
  torch::manual_seed(0);
  const std::vector<Batch> data = make_data();
  auto fresh = make_model();
  const double untrained = eval(fresh, data);
  const double losses[] = {steps_on_the_optimizer_thread(data),
                           asynchronous_step_jobs(data),
                           the_pipeline(data),
                           the_fused_pipeline(data),
                           the_overlapped_backward(data),
                           a_recorded_run(data, trace)};
  std::cout << "eval loss: untrained " << untrained << ", steps " << losses[0] << ", submit "
            << losses[1] << ", pipeline " << losses[2] << ", fused pipeline " << losses[3]
            << ", overlapped backward " << losses[4] << ", recorded " << losses[5]
            << "\nreplay the trace with: ampactor-replay " << trace << "\n";
  the_model_on_the_gpu(data);
  the_overlapped_backward_on_the_gpu(data);
  for (double l : losses)
    if (!(l < untrained)) return 1;  // each way trained
  return 0;
} catch (const std::exception& e) {
  std::cerr << "async_steps: " << e.what() << "\n";
  return 1;
}
