// Four small random intensity stages sharing one file (each wraps one torch expression):
// rand_shift_intensity, rand_scale_intensity, rand_gamma, rand_gaussian_noise.
#include <torch/torch.h>

#include "pipeline/options.hpp"
#include "pipeline/stage_registry.hpp"
#include "pipeline/transforms/detail/channel_stage.hpp"
#include "pipeline/transforms/detail/tensor_util.hpp"
#include "pipeline/transforms/intensity.hpp"
#include "pipeline/transforms/register.hpp"

namespace segflow::pipeline {

void RandShiftIntensityOptions::bind(OptionParser& p) {
  p.strings("keys", keys, true, "tensors to shift (floating)");
  p.number("prob", prob, Range::closed(0, 1), "", "chance of shifting");
  p.number("offsets", offsets, Range::non_negative(), "intensity units",
           "offset uniform in [-offsets, offsets]");
  p.boolean("allow_missing_keys", allow_missing_keys,
            "skip keys a sample lacks (e.g. no label at inference)");
}

void RandScaleIntensityOptions::bind(OptionParser& p) {
  p.strings("keys", keys, true, "tensors to scale (floating)");
  p.number("prob", prob, Range::closed(0, 1), "", "chance of scaling");
  p.number("factors", factors, Range::non_negative(), "", "x * (1 + f), f uniform in [-factors, factors]");
  p.boolean("allow_missing_keys", allow_missing_keys,
            "skip keys a sample lacks (e.g. no label at inference)");
}

void RandGammaOptions::bind(OptionParser& p) {
  p.strings("keys", keys, true, "tensors to adjust (floating)");
  p.number("prob", prob, Range::closed(0, 1), "", "chance of adjusting");
  detail::bind_interval(p, "gamma", gamma, Range::positive(), "", "gamma in [lo, hi] (see sampling)");
  detail::bind_sampling(p, sampling, gamma, "gamma");
  p.number("invert_prob", invert_prob, Range::closed(0, 1), "",
           "chance of applying to -x (invert, gamma, invert back; nnU-Net's p_invert_image)");
  p.boolean("retain_stats", retain_stats, "restore the mean and std the tensor (channel) had before");
  p.boolean("channel_wise", channel_wise,
            "own gamma, inversion and min/max per channel (else one per tensor)");
  p.boolean("allow_missing_keys", allow_missing_keys,
            "skip keys a sample lacks (e.g. no label at inference)");
}

void RandGaussianNoiseOptions::bind(OptionParser& p) {
  p.strings("keys", keys, true, "tensors to add noise to (floating)");
  p.number("prob", prob, Range::closed(0, 1), "", "chance of adding noise");
  p.number("mean", mean, Range::any(), "intensity units", "noise mean");
  p.number("std", std, Range::non_negative(), "intensity units",
           "noise standard deviation (the maximum when sample_std)");
  p.boolean("sample_std", sample_std, "draw the std uniformly in [0, std] per sample");
  p.boolean("allow_missing_keys", allow_missing_keys,
            "skip keys a sample lacks (e.g. no label at inference)");
}

at::Tensor adjust_gamma(const at::Tensor& x, double gamma) {
  constexpr double kEps = 1e-7;
  const at::Tensor lo = x.min(), range = x.max() - lo;
  return ((x - lo) / (range + kEps)).pow(gamma) * range + lo;
}

at::Tensor adjust_gamma(const at::Tensor& x, double gamma, bool invert, bool retain_stats) {
  constexpr double kStdEps = 1e-7;  // batchgeneratorsv2's GammaTransform
  const at::Tensor v = invert ? -x : x;
  at::Tensor y = adjust_gamma(v, gamma);
  if (retain_stats) {
    const at::Tensor mean = v.mean(), std = v.std();
    y = (y - y.mean()) * (std / y.std().clamp_min(kStdEps)) + mean;
  }
  return invert ? -y : y;
}

namespace {

// One class for the four: `Draw` draws the parameters (nullopt: leave the sample), `Apply`
// maps one tensor.
template <class Derived, class Opts>
class RandIntensityStage : public MapStage {
 public:
  using Options = Opts;
  static constexpr bool kDeterministic = false;
  RandIntensityStage(Options o, nlohmann::json resolved)
      : MapStage(Derived::kName, std::move(resolved), o.keys), o_(std::move(o)) {}
  bool deterministic() const override { return false; }

  Status apply_sample(Sample& s, Rng& rng) const override {
    const auto keys = detail::present_keys(s, o_.keys, o_.allow_missing_keys);
    SEGFLOW_RETURN_IF_ERROR(detail::check_floating(s, keys, Derived::kName));
    if (!rng.bernoulli(o_.prob)) return Status::ok();
    const auto& self = static_cast<const Derived&>(*this);
    const double param = self.draw(rng);
    for (const auto& k : keys) s.at(k) = self.map(s.at(k), param, rng);
    return Status::ok();
  }

 protected:
  Options o_;
};

class RandShiftIntensityStage final
    : public RandIntensityStage<RandShiftIntensityStage, RandShiftIntensityOptions> {
 public:
  using RandIntensityStage::RandIntensityStage;
  static constexpr const char* kName = "rand_shift_intensity";
  static constexpr const char* kDoc = "add a random offset with probability prob";
  double draw(Rng& rng) const { return rng.uniform(-o_.offsets, o_.offsets); }
  at::Tensor map(const at::Tensor& x, double offset, Rng&) const { return x + offset; }
};

class RandScaleIntensityStage final
    : public RandIntensityStage<RandScaleIntensityStage, RandScaleIntensityOptions> {
 public:
  using RandIntensityStage::RandIntensityStage;
  static constexpr const char* kName = "rand_scale_intensity";
  static constexpr const char* kDoc = "multiply by 1 + a random factor with probability prob";
  double draw(Rng& rng) const { return 1.0 + rng.uniform(-o_.factors, o_.factors); }
  at::Tensor map(const at::Tensor& x, double factor, Rng&) const { return x * factor; }
};

class RandGammaStage final : public MapStage {
 public:
  using Options = RandGammaOptions;
  static constexpr const char* kName = "rand_gamma";
  static constexpr const char* kDoc =
      "random gamma contrast adjustment (MONAI RandAdjustContrast; nnU-Net's GammaTransform with "
      "invert_prob, retain_stats, channel_wise)";
  static constexpr bool kDeterministic = false;
  RandGammaStage(Options o, nlohmann::json resolved)
      : MapStage(kName, std::move(resolved), o.keys), o_(std::move(o)) {}
  bool deterministic() const override { return false; }

  // Draws: bernoulli(prob); then one (gamma, invert) for the sample, or with channel_wise
  // one per key and channel in order. invert draws nothing when invert_prob is 0, so the
  // defaults draw what rand_gamma always drew.
  Status apply_sample(Sample& s, Rng& rng) const override {
    const auto keys = detail::present_keys(s, o_.keys, o_.allow_missing_keys);
    SEGFLOW_RETURN_IF_ERROR(detail::check_floating(s, keys, kName));
    if (!rng.bernoulli(o_.prob)) return Status::ok();
    if (!o_.channel_wise) {
      const Draw d = draw(rng);
      for (const auto& k : keys) s.at(k) = adjust_gamma(s.at(k), d.gamma, d.invert, o_.retain_stats);
      return Status::ok();
    }
    for (const auto& k : keys) {
      const at::Tensor x = s.at(k);
      std::vector<at::Tensor> channels;
      for (std::int64_t c = 0; c < x.size(0); ++c) {
        const Draw d = draw(rng);
        channels.push_back(adjust_gamma(x.select(0, c), d.gamma, d.invert, o_.retain_stats));
      }
      s.at(k) = torch::stack(channels, 0);
    }
    return Status::ok();
  }

 private:
  struct Draw {
    double gamma = 1.0;
    bool invert = false;
  };
  Draw draw(Rng& rng) const {
    Draw d;
    d.gamma = detail::draw_factor(rng, o_.gamma, o_.sampling);
    d.invert = o_.invert_prob > 0 && rng.bernoulli(o_.invert_prob);
    return d;
  }
  Options o_;
};

class RandGaussianNoiseStage final
    : public RandIntensityStage<RandGaussianNoiseStage, RandGaussianNoiseOptions> {
 public:
  using RandIntensityStage::RandIntensityStage;
  static constexpr const char* kName = "rand_gaussian_noise";
  static constexpr const char* kDoc = "add Gaussian noise with probability prob";
  double draw(Rng& rng) const { return o_.sample_std ? rng.uniform(0.0, o_.std) : o_.std; }
  at::Tensor map(const at::Tensor& x, double std, Rng& rng) const {
    at::Generator gen = detail::make_generator(rng, x.device());
    const auto dtype = (x.scalar_type() == torch::kFloat64) ? torch::kFloat64 : torch::kFloat32;
    at::Tensor noise = at::randn(x.sizes(), gen, torch::TensorOptions().dtype(dtype).device(x.device()));
    return (x + (noise * std + o_.mean).to(x.scalar_type()));
  }
};

}  // namespace

Status register_rand_intensity_stages(StageRegistry& r) {
  SEGFLOW_RETURN_IF_ERROR(add_stage<RandShiftIntensityStage>(r));
  SEGFLOW_RETURN_IF_ERROR(add_stage<RandScaleIntensityStage>(r));
  SEGFLOW_RETURN_IF_ERROR(add_stage<RandGammaStage>(r));
  return add_stage<RandGaussianNoiseStage>(r);
}

}  // namespace segflow::pipeline
