// rand_gaussian_blur: nnU-Net's GaussianBlurTransform (sigma per channel and axis), with the
// filter of scipy.ndimage.gaussian_filter (mode "reflect", radius int(truncate * sigma + 0.5)).
#include <torch/torch.h>

#include <cmath>

#include "pipeline/options.hpp"
#include "pipeline/stage_registry.hpp"
#include "pipeline/transforms/detail/channel_stage.hpp"
#include "pipeline/transforms/intensity.hpp"
#include "pipeline/transforms/register.hpp"

namespace segflow::pipeline {

void RandGaussianBlurOptions::bind(OptionParser& p) {
  p.strings("keys", keys, true, "tensors to blur (floating)");
  p.number("prob", prob, Range::closed(0, 1), "", "chance per sample");
  p.number("prob_per_channel", prob_per_channel, Range::closed(0, 1), "", "then chance per channel");
  detail::bind_interval(p, "sigma", sigma, Range::non_negative(), "voxels", "sigma uniform in [lo, hi]");
  p.boolean("per_axis", per_axis, "own sigma per spatial axis (else one for all axes)");
  p.number("truncate", truncate, Range::positive(), "sigmas", "kernel radius int(truncate * sigma + 0.5)");
  p.boolean("allow_missing_keys", allow_missing_keys,
            "skip keys a sample lacks (e.g. no label at inference)");
}

namespace {

/// scipy's _gaussian_kernel1d (order 0), normalised, float64.
at::Tensor gaussian_kernel1d(double sigma, std::int64_t radius) {
  at::Tensor k = torch::arange(-radius, radius + 1, torch::kFloat64);
  k = (k * k * (-0.5 / (sigma * sigma))).exp();
  return k / k.sum();
}

/// Indices of a dim of `n` voxels padded by `radius` on each side, scipy's "reflect"
/// (d c b a | a b c d | d c b a), repeated as often as the padding needs.
at::Tensor reflect_indices(std::int64_t n, std::int64_t radius, const c10::Device& device) {
  at::Tensor i = torch::arange(-radius, n + radius, torch::kLong);
  i = i.remainder(2 * n);
  i = torch::where(i >= n, 2 * n - 1 - i, i);
  return i.to(device);
}

/// Correlates dim `dim` of `x` with a 1-D Gaussian.
at::Tensor blur_dim(const at::Tensor& x, std::int64_t dim, double sigma, double truncate) {
  const auto radius = static_cast<std::int64_t>(truncate * sigma + 0.5);
  if (sigma <= 0 || radius == 0) return x;
  const std::int64_t n = x.size(dim);
  at::Tensor t = x.movedim(dim, -1).index_select(-1, reflect_indices(n, radius, x.device()));
  const auto sizes = t.sizes().vec();
  at::Tensor w = gaussian_kernel1d(sigma, radius).to(x.options()).view({1, 1, -1});
  t = torch::conv1d(t.reshape({-1, 1, sizes.back()}), w);
  std::vector<std::int64_t> out_sizes(sizes.begin(), sizes.end() - 1);
  out_sizes.push_back(n);
  return t.reshape(out_sizes).movedim(-1, dim);
}

}  // namespace

at::Tensor gaussian_blur(const at::Tensor& x, const std::vector<double>& sigma, double truncate) {
  const std::int64_t nsp = x.dim() - 1;
  TORCH_CHECK(static_cast<std::int64_t>(sigma.size()) == nsp, "gaussian_blur: ", sigma.size(), " sigmas for ",
              nsp, " spatial dims");
  at::Tensor y = x;
  for (std::int64_t d = 0; d < nsp; ++d) y = blur_dim(y, d + 1, sigma[d], truncate);
  return y.contiguous();
}

namespace {

class RandGaussianBlurStage final
    : public detail::RandChannelStage<RandGaussianBlurStage, RandGaussianBlurOptions> {
 public:
  using RandChannelStage::RandChannelStage;
  static constexpr const char* kName = "rand_gaussian_blur";
  static constexpr const char* kDoc =
      "nnU-Net's Gaussian blur: per channel (prob_per_channel) a sigma per axis, scipy's "
      "gaussian_filter";
  Status check_tensor(const Sample& s, const std::string& k) const {
    return detail::check_image_dims(s, k, kName);
  }
  /// Sigmas in tensor order (z, y, x): one draw per axis, or one for all.
  std::vector<double> draw(Rng& rng, const at::Tensor& x) const {
    const std::int64_t nsp = x.dim() - 1;
    std::vector<double> s(nsp, 0.0);
    for (std::int64_t d = 0; d < nsp; ++d)
      s[d] = (o_.per_axis || d == 0) ? rng.uniform(o_.sigma[0], o_.sigma[1]) : s[0];
    return s;
  }
  at::Tensor map(const at::Tensor& channel, const std::vector<double>& sigma) const {
    return gaussian_blur(channel.unsqueeze(0), sigma, o_.truncate).squeeze(0);
  }
};

}  // namespace

Status register_rand_gaussian_blur_stage(StageRegistry& r) { return add_stage<RandGaussianBlurStage>(r); }

}  // namespace segflow::pipeline
