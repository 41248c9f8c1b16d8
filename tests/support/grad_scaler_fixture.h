// Includes and helpers shared by the GradScaler facade tests.
// The actor-backed GradScaler with real threads: its trajectory against the thread-free
// LocalGradScaler (torch's semantics), every misuse, exception propagation, results and shutdown.
#pragma once
#include "doctest_torch.h"

#include <ampactor/actors/grad_scaler.h>
#include <ampactor/actors/optimizer_actor.h>
#include <ampactor/messages/registry.h>
#include <ampactor/scaler/local_grad_scaler.h>

#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/scalar_tensor.h>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/all.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "scale_options.h"
#include "workload.h"

using namespace ampactor;
using ampactor::test::Net;
using ampactor::test::opts;
using ampactor::test::Trajectory;
using ampactor::test::Workload;

namespace {

constexpr int kIters = 300;

inline Trajectory run_reference(const GradScalerOptions& o, const Workload& w, bool adam) {
  LocalGradScaler ref(o);
  Net net(adam);
  Trajectory t;
  for (iteration_t k = 0; k < kIters; ++k) {
    ref.scale(at::ones({1}));
    const float s = float(ref.get_scale());
    net.set_grads(w.grads(k, s));
    ref.step(*net.opt);
    t.scales.push_back(s);
    t.skipped.push_back(*ref.found_inf(*net.opt));
    ref.update();
  }
  for (auto& p : net.params)
    t.params.push_back(p.detach().clone());
  t.final_scale = ref.get_scale();
  return t;
}

enum class Mode { main_step, submit };

inline Trajectory run_actors(const GradScalerOptions& o, const Workload& w, bool adam, Mode mode) {
  GradScaler scaler(o);
  Net net(adam);
  Trajectory t;
  for (iteration_t k = 0; k < kIters; ++k) {
    scaler.scale(at::ones({1}));
    const float s = float(scaler.get_scale());
    auto g = w.grads(k, s);
    if (mode == Mode::main_step) {
      net.set_grads(g);  // the optimizer thread is idle: step() waits for its job
      scaler.step(*net.opt);
    } else {
      scaler.submit([&net, &scaler, g] {
        net.set_grads(g);
        scaler.step(*net.opt);
      });
    }
    scaler.update();
    t.scales.push_back(s);
  }
  scaler.sync();
  for (iteration_t k = 0; k < kIters; ++k) {
    IterationResult r = scaler.wait_result(k);
    REQUIRE(r.steps.size() == 1);
    CHECK(r.steps[0].scale_used == t.scales[std::size_t(k)]);
    t.skipped.push_back(r.steps[0].skipped);
  }
  for (auto& p : net.params)
    t.params.push_back(p.detach().clone());
  t.final_scale = scaler.get_scale();
  return t;
}

/// An optimizer whose step() throws, to follow an exception from the optimizer thread.
struct ThrowingSGD : torch::optim::SGD {
  using SGD::SGD;
  at::Tensor step(LossClosure) override { throw std::logic_error("bad step"); }
};

}  // namespace
