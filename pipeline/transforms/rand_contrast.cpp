// rand_contrast: nnU-Net's ContrastTransform (a factor per channel, the mean kept, the range
// preserved).
#include <torch/torch.h>

#include "pipeline/options.hpp"
#include "pipeline/stage_registry.hpp"
#include "pipeline/transforms/detail/channel_stage.hpp"
#include "pipeline/transforms/intensity.hpp"
#include "pipeline/transforms/register.hpp"

namespace segflow::pipeline {

void RandContrastOptions::bind(OptionParser& p) {
  p.strings("keys", keys, true, "tensors to adjust (floating)");
  p.number("prob", prob, Range::closed(0, 1), "", "chance per sample");
  p.number("prob_per_channel", prob_per_channel, Range::closed(0, 1), "", "then chance per channel");
  detail::bind_interval(p, "factor", factor, Range::non_negative(), "",
                        "(x - mean) * f + mean, f in [lo, hi] per channel (see sampling)");
  detail::bind_sampling(p, sampling, factor, "factor");
  p.boolean("preserve_range", preserve_range, "clip to the channel's min and max before the change");
  p.boolean("allow_missing_keys", allow_missing_keys,
            "skip keys a sample lacks (e.g. no label at inference)");
}

at::Tensor adjust_contrast(const at::Tensor& x, double factor, bool preserve_range) {
  const at::Tensor mean = x.mean();
  at::Tensor y = (x - mean) * factor + mean;
  if (preserve_range) y = torch::clamp(y, x.min(), x.max());
  return y;
}

namespace {

class RandContrastStage final : public detail::RandChannelStage<RandContrastStage, RandContrastOptions> {
 public:
  using RandChannelStage::RandChannelStage;
  static constexpr const char* kName = "rand_contrast";
  static constexpr const char* kDoc =
      "nnU-Net's contrast: (x - mean) * f + mean per channel, clipped to the channel's old range";
  double draw(Rng& rng, const at::Tensor&) const { return detail::draw_factor(rng, o_.factor, o_.sampling); }
  at::Tensor map(const at::Tensor& channel, double f) const {
    return adjust_contrast(channel, f, o_.preserve_range);
  }
};

}  // namespace

Status register_rand_contrast_stage(StageRegistry& r) { return add_stage<RandContrastStage>(r); }

}  // namespace segflow::pipeline
