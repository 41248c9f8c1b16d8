// Options in LibTorch's TORCH_ARG style: per option a private member `name_`, a getter `name()`
// and a chainable setter `name(value)` returning the options, so options are named, not
// positional (reordering a field cannot silently change a call's meaning). Torch-free.
#pragma once

#include <utility>

/// A checked option: the setter is only declared here; its definition checks the value (throwing
/// ScalerError and storing nothing) before storing it.
#define AMPACTOR_ARG(T, name, default_value) \
 public:                                     \
  const T& name() const noexcept {           \
    return name##_;                          \
  }                                          \
  auto name(T value)->decltype(*this);       \
                                             \
 private:                                    \
  T name##_ = default_value

/// An option every value of T is valid for (a bool, an optional pointer): the setter stores it.
#define AMPACTOR_ARG_ANY(T, name, default_value) \
 public:                                         \
  const T& name() const noexcept {               \
    return name##_;                              \
  }                                              \
  auto name(T value)->decltype(*this) {          \
    name##_ = std::move(value);                  \
    return *this;                                \
  }                                              \
                                                 \
 private:                                        \
  T name##_ = default_value
