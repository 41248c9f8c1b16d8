// What a refused call threw: the code and text of its ScalerError.
#pragma once

#include <ampactor/core/errors.h>

#include <string>
#include <utility>

namespace ampactor::test {

struct Refusal {
  errc code{};  // errc{} when nothing was thrown
  std::string what;
  bool mentions(const std::string& part) const { return what.find(part) != std::string::npos; }
};

/// Runs f and reports the ScalerError it threw; any other exception escapes and fails the test.
template <typename F>
Refusal refusal_of(F&& f) {
  try {
    f();
  } catch (const ScalerError& e) {
    return {e.code(), e.what()};
  }
  return {};
}

/// The code of the ScalerError f threw (errc{} when none).
template <typename F>
errc code_of(F&& f) {
  return refusal_of(std::forward<F>(f)).code;
}

}  // namespace ampactor::test
