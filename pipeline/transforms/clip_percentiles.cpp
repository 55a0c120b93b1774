// clip_percentiles: per image and channel, clip to its own percentiles (optionally over the
// non-zero voxels), optionally rescaled to [b_min, b_max] (MONAI's
// ScaleIntensityRangePercentiles with clip, channel_wise).
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "pipeline/options.hpp"
#include "pipeline/stage_registry.hpp"
#include "pipeline/transforms/detail/tensor_util.hpp"
#include "pipeline/transforms/intensity.hpp"
#include "pipeline/transforms/register.hpp"

namespace segflow::pipeline {

void ClipPercentilesOptions::bind(OptionParser& p) {
  p.strings("keys", keys, true, "tensors to clip");
  p.number("lower", lower, Range::closed(0, 100), "percent", "lower percentile");
  p.number("upper", upper, Range::closed(0, 100), "percent", "upper percentile, >= lower");
  if (p.ok() && lower > upper)
    p.fail("upper",
           "expected upper >= lower, got lower " + format_value(lower) + " and upper " + format_value(upper));
  p.boolean("nonzero", nonzero, "percentiles of the channel's non-zero voxels; zero voxels stay 0");
  p.boolean("rescale", rescale, "then map [lower value, upper value] linearly to [b_min, b_max]");
  p.number("b_min", b_min, Range::any(), "", "output of the lower percentile value (with rescale)");
  p.number("b_max", b_max, Range::any(), "", "output of the upper percentile value (with rescale)");
  p.boolean("allow_missing_keys", allow_missing_keys,
            "skip keys a sample lacks (e.g. no label at inference)");
}

double percentile(const at::Tensor& x, double q) {
  const at::Tensor v = x.flatten();
  const std::int64_t n = v.numel();
  if (n == 0) return std::numeric_limits<double>::quiet_NaN();
  // numpy's "linear" method: the virtual index (n - 1) q / 100 between two order statistics,
  // found with kthvalue (no size limit, unlike torch.quantile; no full sort).
  const double pos = (static_cast<double>(n) - 1.0) * q / 100.0;
  const auto below = static_cast<std::int64_t>(std::floor(pos));
  const double t = pos - static_cast<double>(below);
  auto kth = [&](std::int64_t k) {  // the k-th smallest, 0-based
    return std::get<0>(torch::kthvalue(v, k + 1)).item<double>();
  };
  const double a = kth(below);
  if (t == 0.0 || below + 1 >= n) return a;
  const double b = kth(below + 1);
  return t < 0.5 ? a + (b - a) * t : b - (b - a) * (1.0 - t);  // numpy's _lerp
}

namespace {
at::Tensor clip_channel(const at::Tensor& x, double lower, double upper, bool nonzero, bool rescale,
                        double b_min, double b_max) {
  const at::Tensor sel = nonzero ? x.ne(0) : at::Tensor();
  const at::Tensor values = nonzero ? x.masked_select(sel) : x;
  if (values.numel() == 0) return x.clone();
  const double lo = percentile(values, lower), hi = percentile(values, upper);
  at::Tensor y = x.clamp(lo, hi);
  if (rescale) y = hi > lo ? (y - lo) * ((b_max - b_min) / (hi - lo)) + b_min : torch::full_like(y, b_min);
  return nonzero ? torch::where(sel, y, x) : y;
}
}  // namespace

at::Tensor clip_percentiles(const at::Tensor& x, double lower, double upper, bool nonzero, bool rescale,
                            double b_min, double b_max) {
  const at::Tensor f = detail::is_floating(x) ? x : x.to(torch::kFloat32);
  if (f.dim() == 0) return clip_channel(f, lower, upper, nonzero, rescale, b_min, b_max);
  std::vector<at::Tensor> out;
  for (std::int64_t c = 0; c < f.size(0); ++c)
    out.push_back(clip_channel(f[c], lower, upper, nonzero, rescale, b_min, b_max));
  return torch::stack(out, 0);
}

namespace {

class ClipPercentilesStage final : public MapStage {
 public:
  using Options = ClipPercentilesOptions;
  static constexpr const char* kName = "clip_percentiles";
  static constexpr const char* kDoc =
      "per image and channel, clip to its own lower/upper percentiles (optionally of the non-zero "
      "voxels), optionally rescaled to [b_min, b_max]";
  static constexpr bool kDeterministic = true;

  ClipPercentilesStage(Options o, nlohmann::json resolved)
      : MapStage(kName, std::move(resolved), o.keys), o_(std::move(o)) {}
  bool deterministic() const override { return true; }

  Status apply_sample(Sample& s, Rng&) const override {
    for (const auto& k : detail::present_keys(s, o_.keys, o_.allow_missing_keys)) {
      if (!s.has(k)) return detail::check_keys(s, {k}, kName).status();
      s.at(k) = clip_percentiles(s.at(k), o_.lower, o_.upper, o_.nonzero, o_.rescale, o_.b_min, o_.b_max);
    }
    return Status::ok();
  }

 private:
  Options o_;
};

}  // namespace

Status register_clip_percentiles_stage(StageRegistry& r) { return add_stage<ClipPercentilesStage>(r); }

}  // namespace segflow::pipeline
