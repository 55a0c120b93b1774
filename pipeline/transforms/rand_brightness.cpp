// rand_brightness: nnU-Net's MultiplicativeBrightnessTransform (a factor per channel).
#include <torch/torch.h>

#include "pipeline/options.hpp"
#include "pipeline/stage_registry.hpp"
#include "pipeline/transforms/detail/channel_stage.hpp"
#include "pipeline/transforms/intensity.hpp"
#include "pipeline/transforms/register.hpp"

namespace segflow::pipeline {

void RandBrightnessOptions::bind(OptionParser& p) {
  p.strings("keys", keys, true, "tensors to scale (floating)");
  p.number("prob", prob, Range::closed(0, 1), "", "chance per sample");
  p.number("prob_per_channel", prob_per_channel, Range::closed(0, 1), "", "then chance per channel");
  detail::bind_interval(p, "multiplier", multiplier, Range::non_negative(), "",
                        "x * m, m in [lo, hi] per channel (see sampling)");
  detail::bind_sampling(p, sampling, multiplier, "multiplier");
  p.boolean("allow_missing_keys", allow_missing_keys,
            "skip keys a sample lacks (e.g. no label at inference)");
}

namespace {

class RandBrightnessStage final
    : public detail::RandChannelStage<RandBrightnessStage, RandBrightnessOptions> {
 public:
  using RandChannelStage::RandChannelStage;
  static constexpr const char* kName = "rand_brightness";
  static constexpr const char* kDoc = "nnU-Net's multiplicative brightness: x * m, m drawn per channel";
  double draw(Rng& rng, const at::Tensor&) const {
    return detail::draw_factor(rng, o_.multiplier, o_.sampling);
  }
  at::Tensor map(const at::Tensor& channel, double m) const { return channel * m; }
};

}  // namespace

Status register_rand_brightness_stage(StageRegistry& r) { return add_stage<RandBrightnessStage>(r); }

}  // namespace segflow::pipeline
