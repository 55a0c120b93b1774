#include "pipeline/transforms/detail/channel_stage.hpp"

#include <c10/core/ScalarType.h>

#include <algorithm>

#include "pipeline/options.hpp"

namespace segflow::pipeline {

const char* to_string(FactorSampling s) {
  switch (s) {
    case FactorSampling::uniform:
      return "uniform";
    case FactorSampling::halves:
      return "halves";
  }
  return "uniform";
}

}  // namespace segflow::pipeline

namespace segflow::pipeline::detail {

Status check_floating(const Sample& s, const std::vector<std::string>& keys, const char* stage) {
  for (const auto& k : keys) {
    if (!s.has(k)) return check_keys(s, {k}, stage).status();
    if (!is_floating(s.at(k)))
      return invalid_argument(std::string(stage) + ": sample '" + s.id + "': '" + k + "' is " +
                              std::string(c10::toString(s.at(k).scalar_type())) +
                              "; intensity stages need floating tensors");
  }
  return Status::ok();
}

Status check_image_dims(const Sample& s, const std::string& key, const char* stage) {
  const at::Tensor& t = s.at(key);
  if (t.dim() == 3 || t.dim() == 4) return Status::ok();
  return invalid_argument(std::string(stage) + ": sample '" + s.id + "': '" + key + "' has shape " +
                          shape_string(t) + "; expected (C, Y, X) or (C, Z, Y, X)");
}

double draw_factor(Rng& rng, const std::array<double, 2>& range, FactorSampling sampling) {
  if (sampling == FactorSampling::halves) {
    // nnU-Net's BGContrast: the coin is always drawn, then one uniform.
    const bool below = rng.uniform() < 0.5 && range[0] < 1.0;
    return below ? rng.uniform(range[0], 1.0) : rng.uniform(std::max(range[0], 1.0), range[1]);
  }
  return rng.uniform(range[0], range[1]);
}

void bind_sampling(OptionParser& p, FactorSampling& field, const std::array<double, 2>& range,
                   const char* range_key) {
  std::string name = to_string(field);
  p.choice("sampling", name, {"uniform", "halves"},
           "uniform in [lo, hi], or halves: with chance 1/2 in [lo, 1), else in [1, hi] (nnU-Net)");
  field = name == "halves" ? FactorSampling::halves : FactorSampling::uniform;
  if (p.ok() && field == FactorSampling::halves && !(range[0] <= 1.0 && 1.0 <= range[1]))
    p.fail(range_key, "expected [lo, hi] with lo <= 1 <= hi for sampling: halves, got " +
                          format_value(nlohmann::json(range)));
}

void bind_interval(OptionParser& p, const char* key, std::array<double, 2>& field, Range range,
                   const char* unit, const char* doc) {
  p.numbers(key, field, range, false, unit, doc);
  if (p.ok() && field[0] > field[1])
    p.fail(key, "expected [lo, hi] with lo <= hi, got " + format_value(nlohmann::json(field)));
}

}  // namespace segflow::pipeline::detail
