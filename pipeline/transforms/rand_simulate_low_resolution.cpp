// rand_simulate_low_resolution: nnU-Net's SimulateLowResolutionTransform (batchgeneratorsv2):
// per channel, downsample by a random zoom (nearest-exact) and upsample back (linear).
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "pipeline/options.hpp"
#include "pipeline/stage_registry.hpp"
#include "pipeline/transforms/detail/channel_stage.hpp"
#include "pipeline/transforms/intensity.hpp"
#include "pipeline/transforms/register.hpp"

namespace segflow::pipeline {

void RandSimulateLowResolutionOptions::bind(OptionParser& p) {
  p.strings("keys", keys, true, "tensors to degrade (floating)");
  p.number("prob", prob, Range::closed(0, 1), "", "chance per sample");
  p.number("prob_per_channel", prob_per_channel, Range::closed(0, 1), "", "then chance per channel");
  detail::bind_interval(p, "zoom", zoom, Range{0.0, 1.0, true, false}, "",
                        "zoom uniform in [lo, hi]: round(n * zoom) voxels before upsampling back");
  p.boolean("per_axis", per_axis, "own zoom per spatial axis (else one for all; nnU-Net: one)");
  p.integer_list("ignore_axes", ignore_axes, Range::closed(0, 2), true,
                 "axes kept at full resolution (0 = x, 1 = y, 2 = z; e.g. [2] for thick slices)");
  p.boolean("allow_missing_keys", allow_missing_keys,
            "skip keys a sample lacks (e.g. no label at inference)");
}

at::Tensor simulate_low_resolution(const at::Tensor& x, const std::vector<double>& zoom) {
  namespace F = torch::nn::functional;
  const std::int64_t nsp = x.dim() - 1;
  TORCH_CHECK(static_cast<std::int64_t>(zoom.size()) == nsp && (nsp == 2 || nsp == 3),
              "simulate_low_resolution: ", zoom.size(), " zooms for ", nsp, " spatial dims");
  std::vector<std::int64_t> full(x.sizes().begin() + 1, x.sizes().end()), low(nsp);
  for (std::int64_t d = 0; d < nsp; ++d) {
    // batchgeneratorsv2: round(n * scale) with Python's round (half to even) of a float32 scale.
    const double z = static_cast<float>(zoom[d]);
    low[d] = std::max<std::int64_t>(
        1, static_cast<std::int64_t>(std::nearbyint(static_cast<double>(full[d]) * z)));
  }
  if (low == full) return x;
  // align_corners is ignored by nearest-exact; given only to silence LibTorch's warning.
  at::Tensor y = F::interpolate(
      x.unsqueeze(0), F::InterpolateFuncOptions().size(low).mode(torch::kNearestExact).align_corners(false));
  auto up = F::InterpolateFuncOptions().size(full).align_corners(false);
  up = nsp == 3 ? up.mode(torch::kTrilinear) : up.mode(torch::kBilinear);
  return F::interpolate(y, up).squeeze(0);
}

namespace {

class RandSimulateLowResolutionStage final
    : public detail::RandChannelStage<RandSimulateLowResolutionStage, RandSimulateLowResolutionOptions> {
 public:
  using RandChannelStage::RandChannelStage;
  static constexpr const char* kName = "rand_simulate_low_resolution";
  static constexpr const char* kDoc =
      "nnU-Net's simulated low resolution: per channel, downsample by a random zoom (nearest) and "
      "upsample back (linear)";
  Status check_tensor(const Sample& s, const std::string& k) const {
    return detail::check_image_dims(s, k, kName);
  }
  /// Zooms in tensor order (z, y, x): one draw per axis, or one for all; ignored axes get 1.
  std::vector<double> draw(Rng& rng, const at::Tensor& x) const {
    const std::int64_t nsp = x.dim() - 1;
    std::vector<double> z(nsp, 1.0);
    for (std::int64_t d = 0; d < nsp; ++d)
      z[d] = (o_.per_axis || d == 0) ? rng.uniform(o_.zoom[0], o_.zoom[1]) : z[0];
    for (std::int64_t a : o_.ignore_axes)
      if (a < nsp) z[nsp - 1 - a] = 1.0;
    return z;
  }
  at::Tensor map(const at::Tensor& channel, const std::vector<double>& zoom) const {
    return simulate_low_resolution(channel.unsqueeze(0), zoom).squeeze(0);
  }
};

}  // namespace

Status register_rand_simulate_low_resolution_stage(StageRegistry& r) {
  return add_stage<RandSimulateLowResolutionStage>(r);
}

}  // namespace segflow::pipeline
