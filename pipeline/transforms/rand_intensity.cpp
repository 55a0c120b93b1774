// Four small random intensity stages sharing one file (each wraps one torch expression):
// rand_shift_intensity, rand_scale_intensity, rand_gamma, rand_gaussian_noise.
#include <torch/torch.h>

#include "pipeline/options.hpp"
#include "pipeline/stage_registry.hpp"
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
  p.numbers("gamma", gamma, Range::positive(), false, "", "gamma uniform in [lo, hi]");
  if (p.ok() && gamma[0] > gamma[1])
    p.fail("gamma", "expected [lo, hi] with lo <= hi, got " + format_value(nlohmann::json(gamma)));
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

namespace {

Status check_floating(const Sample& s, const std::vector<std::string>& keys, const char* stage) {
  for (const auto& k : keys) {
    if (!s.has(k)) return detail::check_keys(s, {k}, stage).status();
    if (!detail::is_floating(s.at(k)))
      return invalid_argument(std::string(stage) + ": sample '" + s.id + "': '" + k + "' is " +
                              std::string(c10::toString(s.at(k).scalar_type())) +
                              "; intensity stages need floating tensors");
  }
  return Status::ok();
}

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
    SEGFLOW_RETURN_IF_ERROR(check_floating(s, keys, Derived::kName));
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

class RandGammaStage final : public RandIntensityStage<RandGammaStage, RandGammaOptions> {
 public:
  using RandIntensityStage::RandIntensityStage;
  static constexpr const char* kName = "rand_gamma";
  static constexpr const char* kDoc = "random gamma contrast adjustment (MONAI RandAdjustContrast)";
  double draw(Rng& rng) const { return rng.uniform(o_.gamma[0], o_.gamma[1]); }
  at::Tensor map(const at::Tensor& x, double gamma, Rng&) const { return adjust_gamma(x, gamma); }
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
