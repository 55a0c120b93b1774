#include <torch/torch.h>

#include "pipeline/options.hpp"
#include "pipeline/stage_registry.hpp"
#include "pipeline/transforms/detail/tensor_util.hpp"
#include "pipeline/transforms/intensity.hpp"
#include "pipeline/transforms/register.hpp"

namespace segflow::pipeline {

void NormalizeIntensityOptions::bind(OptionParser& p) {
  p.strings("keys", keys, true, "tensors to normalise");
  p.boolean("nonzero", nonzero, "statistics over non-zero voxels only; zero voxels stay 0");
  p.boolean("channel_wise", channel_wise, "one mean/std per channel (else one over all channels)");
  p.string("mask_key", mask_key, "when set: statistics over mask > 0 only; voxels outside are set to 0");
  p.boolean("allow_missing_keys", allow_missing_keys,
            "skip keys a sample lacks (e.g. no label at inference)");
}

namespace {
at::Tensor normalize_selected(const at::Tensor& x, const at::Tensor& sel) {
  // Statistics in float64 for accuracy; population std (std of the output is exactly 1).
  const at::Tensor xs = sel.defined() ? x.masked_select(sel) : x.flatten();
  if (xs.numel() == 0) return torch::zeros_like(x);
  const at::Tensor xd = xs.to(torch::kFloat64);
  const at::Tensor mean = xd.mean();
  at::Tensor std = xd.std(/*unbiased=*/false);
  std = torch::where(std > 0, std, torch::ones_like(std));
  at::Tensor y = ((x.to(torch::kFloat64) - mean) / std).to(x.scalar_type());
  if (sel.defined()) y = torch::where(sel, y, torch::zeros_like(y));
  return y;
}
}  // namespace

at::Tensor normalize_intensity(const at::Tensor& x, const at::Tensor& mask, bool nonzero, bool channel_wise) {
  const at::Tensor f = detail::is_floating(x) ? x : x.to(torch::kFloat32);
  at::Tensor sel;
  if (mask.defined()) sel = (mask > 0).expand_as(f);
  if (nonzero) sel = sel.defined() ? sel.logical_and(f != 0) : (f != 0);
  if (!channel_wise || f.dim() == 0) return normalize_selected(f, sel);
  std::vector<at::Tensor> out;
  for (std::int64_t c = 0; c < f.size(0); ++c)
    out.push_back(normalize_selected(f[c], sel.defined() ? sel[c] : at::Tensor()));
  return torch::stack(out, 0);
}

namespace {

class NormalizeIntensityStage final : public MapStage {
 public:
  using Options = NormalizeIntensityOptions;
  static constexpr const char* kName = "normalize_intensity";
  static constexpr const char* kDoc =
      "z-score: subtract the mean, divide by the std (optionally non-zero or masked)";
  static constexpr bool kDeterministic = true;

  NormalizeIntensityStage(Options o, nlohmann::json resolved)
      : MapStage(kName, std::move(resolved), o.keys), o_(std::move(o)) {}
  bool deterministic() const override { return true; }

  Status apply_sample(Sample& s, Rng&) const override {
    const auto keys = detail::present_keys(s, o_.keys, o_.allow_missing_keys);
    if (keys.empty()) return Status::ok();
    at::Tensor mask;
    if (!o_.mask_key.empty()) {
      std::vector<std::string> all = keys;
      all.push_back(o_.mask_key);
      SEGFLOW_RETURN_IF_ERROR(detail::check_keys(s, all, kName).status());
      mask = s.at(o_.mask_key);
      if (mask.size(0) != 1)
        for (const auto& k : keys)
          if (s.at(k).size(0) != mask.size(0))
            return invalid_argument(std::string(kName) + ": sample '" + s.id + "': mask '" + o_.mask_key +
                                    "' has " + std::to_string(mask.size(0)) + " channels, '" + k + "' has " +
                                    std::to_string(s.at(k).size(0)) + "; expected 1 or equal");
    }
    for (const auto& k : keys) {
      if (!s.has(k)) return detail::check_keys(s, {k}, kName).status();
      s.at(k) = normalize_intensity(s.at(k), mask, o_.nonzero, o_.channel_wise);
    }
    return Status::ok();
  }

 private:
  Options o_;
};

}  // namespace

Status register_normalize_intensity_stage(StageRegistry& r) { return add_stage<NormalizeIntensityStage>(r); }

}  // namespace segflow::pipeline
