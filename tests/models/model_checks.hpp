#pragma once
// Checks shared by the model tests: gradients of every trainable parameter, equal tensors.

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <set>
#include <string>

namespace segflow::testing {

/// A scalar that depends on every output element with a fixed random weight, so that every
/// parameter on the path gets a generic (non-cancelling) gradient.
inline at::Tensor probe_loss(const at::Tensor& out, uint64_t seed = 7) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto w = at::randn(out.sizes(), gen, at::TensorOptions().dtype(out.scalar_type()));
  return (out * w.to(out.device())).sum();
}

/// Every parameter that requires grad has a finite gradient, and a non-zero one unless it is
/// a convolution bias right before a normalisation ("X.conv.bias" with "X.norm.weight"),
/// whose gradient is mathematically zero (the norm removes a per-channel constant).
/// Parameters that do not require grad must have no gradient.
inline void check_gradients(const torch::nn::Module& module) {
  std::set<std::string> names;
  for (const auto& p : module.named_parameters()) names.insert(p.key());
  size_t checked = 0;
  for (const auto& p : module.named_parameters()) {
    const auto& name = p.key();
    const auto& t = p.value();
    INFO("parameter ", name);
    if (!t.requires_grad()) {
      CHECK_FALSE(t.grad().defined());
      continue;
    }
    REQUIRE(t.grad().defined());
    CHECK(torch::isfinite(t.grad()).all().item<bool>());
    bool before_norm = false;
    const std::string suffix = ".conv.bias";
    if (name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      before_norm = names.count(name.substr(0, name.size() - suffix.size()) + ".norm.weight") > 0;
    }
    if (!before_norm) CHECK(t.grad().abs().max().item<double>() > 0.0);
    ++checked;
  }
  CHECK(checked > 0);
}

/// Max absolute difference of two tensors of equal shape.
inline double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  REQUIRE(a.sizes() == b.sizes());
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

}  // namespace segflow::testing
