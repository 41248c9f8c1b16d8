// A trace that cannot be written (a full disk, a file size limit): said once on stderr and by the
// scaler, the training goes on, and the file ends saying where the recording stopped and why.
#include "trace_fixture.h"

#include <ATen/ops/zeros.h>
#include <torch/optim/sgd.h>

#include <iostream>
#include <sstream>

#include "file_size_limit.h"

namespace {

/// Trains `iters` iterations of plain SGD under a GradScaler recording to `path`; `each` runs
/// after every update.
void train(const std::string& path, int iters, bool raise,
           const std::function<void(GradScaler&, int)>& each) {
  at::Tensor w = at::zeros({64}).set_requires_grad(true);
  torch::optim::SGD opt({w}, torch::optim::SGDOptions(0.01));
  GradScaler scaler(GradScalerOptions().init_scale(1024).growth_interval(2),
                    KeeperOptions().tap(record_trace(path)).raise_tap_failure(raise));
  for (int k = 0; k < iters; ++k) {
    opt.zero_grad();
    scaler.scale((w - 1).pow(2).sum()).backward();
    scaler.step(opt);
    scaler.update();
    each(scaler, k);
  }
}

/// The number N in the failure's "it holds the first N events".
std::size_t events_named(const std::string& failure) {
  const std::string at = "holds the first ";
  const auto i = failure.find(at);
  return i == std::string::npos ? std::size_t(-1) : std::stoul(failure.substr(i + at.size()));
}

}  // namespace

TEST_CASE("a trace that cannot be written: said once on stderr and by the scaler, cut back whole") {
  const std::string path = (scratch() / "write-failure.jsonl").string();
  std::ostringstream err;
  std::streambuf* old = std::cerr.rdbuf(err.rdbuf());  // the keeper's thread is not running yet
  std::string failure;
  int failed_at = -1;
  {
    ampactor::test::FileSizeLimit limit(16 << 10);
    train(path, 60, false, [&](GradScaler& s, int k) {
      if (failure.empty() && !s.tap_failure().empty()) failure = s.tap_failure(), failed_at = k;
    });
  }  // the scaler is gone: its keeper's thread has ended
  std::cerr.rdbuf(old);
  REQUIRE_MESSAGE(failed_at > 0, "the trace never reached the limit");
  CHECK(failed_at < 59);  // the training went on after it
  CHECK(failure.find("the trace " + path + " could not be written (File too large)") == 0);
  const std::string said = err.str();
  CHECK(said.find(failure) != std::string::npos);
  CHECK(said.find("could not be written") == said.rfind("could not be written"));  // once
  // The file holds the events the failure names, whole, and says it is incomplete.
  const Trace t = read_trace(path, /*prefix=*/true);
  CHECK_FALSE(t.complete);
  CHECK(t.events.size() == events_named(failure));
  CHECK(t.events.size() > 0);
  // With room for it, the trailer says why the recording stopped (a read without prefix).
  CHECK(t.stop_reason == failure);
  CHECK_NOTHROW(read_trace(path));
}

TEST_CASE("raise_tap_failure: the scaler call after a trace write failed throws it, once") {
  const std::string path = (scratch() / "write-failure-raise.jsonl").string();
  std::streambuf* old = std::cerr.rdbuf(nullptr);  // the failure's line is the first case's
  int raised = 0, after = 0;
  {
    ampactor::test::FileSizeLimit limit(16 << 10);
    at::Tensor w = at::zeros({64}).set_requires_grad(true);
    torch::optim::SGD opt({w}, torch::optim::SGDOptions(0.01));
    GradScaler scaler(GradScalerOptions().init_scale(1024),
                      KeeperOptions().tap(record_trace(path)).raise_tap_failure(true));
    for (int k = 0; k < 60; ++k) {
      opt.zero_grad();
      scaler.scale((w - 1).pow(2).sum()).backward();
      try {
        scaler.step(opt);
        scaler.update();
        after += raised > 0;
      } catch (const ScalerError& e) {
        CHECK(e.code() == errc::bad_trace);
        CHECK(std::string(e.what()).find("could not be written") != std::string::npos);
        ++raised;
        scaler.step(opt);  // refused before it changed anything: called again, it steps
        scaler.update();
      }
    }
  }
  std::cerr.rdbuf(old);
  CHECK(raised == 1);
  CHECK(after > 0);  // and the training went on
}

TEST_CASE("a trailer that says the recording stopped reads as an incomplete trace, and why") {
  const std::string path = (scratch() / "stopped.jsonl").string();
  train(path, 3, false, [](GradScaler&, int) {});
  Trace whole = read_trace(path);
  REQUIRE(whole.complete);
  // Replace the trailer with one that says the recording stopped after the first 4 events.
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);)
    lines.push_back(l);
  in.close();
  std::ofstream out(path, std::ios::trunc);
  for (std::size_t i = 0; i < 5; ++i)
    out << lines[i] << "\n";
  out << R"({"end":"ampactor","events":4,"stopped":"the disk was full"})"
      << "\n";
  out.close();
  const Trace t = read_trace(path);
  CHECK_FALSE(t.complete);
  CHECK(t.events.size() == 4);
  CHECK(t.stop_reason == "the disk was full");
  CHECK(t.stopped_at == 6);
}
