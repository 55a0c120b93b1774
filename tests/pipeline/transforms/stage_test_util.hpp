#pragma once
// Helpers of the stage/transform tests: samples built from tensors, one-stage pipelines.

#include <doctest/doctest.h>
#include <torch/torch.h>
#include <yaml-cpp/yaml.h>

#include <set>
#include <string>
#include <vector>

#include "pipeline/pipeline_spec.hpp"
#include "pipeline/stage_registry.hpp"
#include "test_util.hpp"

namespace segflow::testing {

/// The built-in registry, built once.
inline const pipeline::StageRegistry& registry() {
  static const pipeline::StageRegistry r = pipeline::builtin_registry();
  return r;
}

/// Makes one stage with options (CHECKs that the options are valid).
inline std::unique_ptr<pipeline::Stage> make_stage(const std::string& name,
                                                   const nlohmann::json& options = {}) {
  REQUIRE_OK_AND_ASSIGN(
      auto r, registry().make(name, options.is_null() ? nlohmann::json::object() : options, "test"));
  return r;
}

/// Runs one 1 -> 1 stage.
inline Sample run1(const pipeline::Stage& st, Sample s, std::uint64_t seed = 0) {
  pipeline::Rng rng(seed);
  REQUIRE_OK_AND_ASSIGN(auto r, pipeline::apply_one(st, std::move(s), rng));
  return r;
}

/// The error message of a stage run that must fail.
inline std::string run_error(const pipeline::Stage& st, Sample s) {
  pipeline::Rng rng(0);
  std::vector<Sample> v{std::move(s)};
  Status e = st.apply(v, rng);
  REQUIRE_FALSE(e.is_ok());
  return e.message();
}

/// A sample with an image (C, Z, Y, X) float and a label (1, Z, Y, X) uint8.
inline Sample make_sample(const at::Tensor& image, const at::Tensor& label = {},
                          const std::string& id = "case") {
  Sample s;
  s.id = id;
  s.tensors["image"] = image;
  if (label.defined()) s.tensors["label"] = label;
  return s;
}

/// Distinct values of an integer tensor.
inline std::set<std::int64_t> values_of(const at::Tensor& t) {
  at::Tensor u = std::get<0>(at::_unique(t.flatten().to(torch::kLong).cpu(), true));
  std::set<std::int64_t> s;
  for (std::int64_t i = 0; i < u.numel(); ++i) s.insert(u[i].item<std::int64_t>());
  return s;
}

/// True when a is a subset of b.
inline bool subset(const std::set<std::int64_t>& a, const std::set<std::int64_t>& b) {
  for (auto v : a)
    if (!b.count(v)) return false;
  return true;
}

/// A (1, Z, Y, X) label with a few classes in boxes, and a matching float image.
inline Sample blob_sample(std::int64_t z = 12, std::int64_t y = 16, std::int64_t x = 20) {
  auto label = torch::zeros({1, z, y, x}, torch::kUInt8);
  label.index_put_(
      {0, torch::indexing::Slice(3, 7), torch::indexing::Slice(4, 9), torch::indexing::Slice(5, 11)}, 1);
  label.index_put_(
      {0, torch::indexing::Slice(6, 9), torch::indexing::Slice(10, 14), torch::indexing::Slice(12, 18)}, 3);
  auto image = torch::arange(z * y * x, torch::kFloat32).reshape({1, z, y, x}) / 100.0f;
  return make_sample(image, label);
}

}  // namespace segflow::testing
