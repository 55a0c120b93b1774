#include <torch/torch.h>

#include "pipeline/options.hpp"
#include "pipeline/stage_registry.hpp"
#include "pipeline/transforms/detail/tensor_util.hpp"
#include "pipeline/transforms/intensity.hpp"
#include "pipeline/transforms/register.hpp"

namespace segflow::pipeline {

void ScaleIntensityRangeOptions::bind(OptionParser& p) {
  p.strings("keys", keys, true, "tensors to scale");
  p.number("a_min", a_min, Range::any(), "input units (HU for CT)", "input value mapped to b_min");
  p.number("a_max", a_max, Range::any(), "input units (HU for CT)", "input value mapped to b_max, != a_min");
  p.number("b_min", b_min, Range::any(), "", "output for a_min");
  p.number("b_max", b_max, Range::any(), "", "output for a_max");
  p.boolean("clip", clip, "clamp the output to [b_min, b_max]");
  if (p.ok() && a_max == a_min)
    p.fail("a_max", "expected a value different from a_min (" + format_value(a_min) + ")");
  p.boolean("allow_missing_keys", allow_missing_keys,
            "skip keys a sample lacks (e.g. no label at inference)");
}

at::Tensor scale_intensity_range(const at::Tensor& x, double a_min, double a_max, double b_min, double b_max,
                                 bool clip) {
  at::Tensor f = detail::is_floating(x) ? x : x.to(torch::kFloat32);
  const double scale = (b_max - b_min) / (a_max - a_min);
  at::Tensor y = (f - a_min) * scale + b_min;
  if (clip) y = y.clamp(std::min(b_min, b_max), std::max(b_min, b_max));
  return y;
}

namespace {

class ScaleIntensityRangeStage final : public MapStage {
 public:
  using Options = ScaleIntensityRangeOptions;
  static constexpr const char* kName = "scale_intensity_range";
  static constexpr const char* kDoc =
      "map [a_min, a_max] linearly to [b_min, b_max] (a CT window), optionally clipped";
  static constexpr bool kDeterministic = true;

  ScaleIntensityRangeStage(Options o, nlohmann::json resolved)
      : MapStage(kName, std::move(resolved), o.keys), o_(std::move(o)) {}
  bool deterministic() const override { return true; }

  Status apply_sample(Sample& s, Rng&) const override {
    const auto keys = detail::present_keys(s, o_.keys, o_.allow_missing_keys);
    for (const auto& k : keys) {
      if (!s.has(k)) return detail::check_keys(s, {k}, kName).status();
      s.at(k) = scale_intensity_range(s.at(k), o_.a_min, o_.a_max, o_.b_min, o_.b_max, o_.clip);
    }
    return Status::ok();
  }

 private:
  Options o_;
};

}  // namespace

Status register_scale_intensity_range_stage(StageRegistry& r) {
  return add_stage<ScaleIntensityRangeStage>(r);
}

}  // namespace segflow::pipeline
