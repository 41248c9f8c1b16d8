// The pipeline's link to its scaler (ampactor::pipeline reaches these GradScaler privates here;
// the public GradScaler names no pipeline). Not installed.
#pragma once

#include <ampactor/actors/grad_scaler.h>

#include <functional>
#include <utility>

namespace ampactor::internal {

/// GradScaler's pipeline-only calls, documented there.
struct PipelineLink {
  static void on_gone(GradScaler& s, const void* who, std::function<void()> gone) {
    s.on_gone(who, std::move(gone));
  }
  static void forget(GradScaler& s, const void* who) noexcept { s.forget(who); }
  static bool submit_from_backward(GradScaler& s, std::function<void()> fn) {
    return s.submit_from_backward(std::move(fn));
  }
};

}  // namespace ampactor::internal
