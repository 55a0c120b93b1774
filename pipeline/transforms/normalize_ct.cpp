// normalize_ct: nnU-Net's CTNormalization with the dataset's foreground statistics.
#include <torch/torch.h>

#include <algorithm>

#include "pipeline/options.hpp"
#include "pipeline/stage_registry.hpp"
#include "pipeline/transforms/detail/tensor_util.hpp"
#include "pipeline/transforms/intensity.hpp"
#include "pipeline/transforms/register.hpp"

namespace segflow::pipeline {

void NormalizeCtOptions::bind(OptionParser& p) {
  p.strings("keys", keys, true, "tensors to normalise");
  p.number_or_list(
      "lower", lower, Range::any(), "input units (HU)",
      "clip below (the fingerprint's foreground percentile 0.5); one per channel or one for all");
  p.number_or_list("upper", upper, Range::any(), "input units (HU)",
                   "clip above (the fingerprint's foreground percentile 99.5)");
  p.number_or_list("mean", mean, Range::any(), "input units (HU)",
                   "subtracted after clipping (the fingerprint's foreground mean)");
  p.number_or_list("std", stddev, Range::non_negative(), "input units (HU)",
                   "divisor, at least 1e-8 (the fingerprint's foreground std)");
  // Lists longer than one are per channel: their lengths must agree.
  std::size_t n = 1;
  const char* first = nullptr;
  for (const auto& [key, v] : {std::pair<const char*, const std::vector<double>*>{"lower", &lower},
                               {"upper", &upper},
                               {"mean", &mean},
                               {"std", &stddev}}) {
    if (!p.ok() || v->size() == 1) continue;
    if (first == nullptr) {
      first = key, n = v->size();
    } else if (v->size() != n) {
      p.fail(key, "expected 1 or " + std::to_string(n) + " values (as " + first + "), got " +
                      std::to_string(v->size()));
    }
  }
  for (std::size_t c = 0; p.ok() && c < std::max(lower.size(), upper.size()); ++c) {
    const double lo = lower[std::min(c, lower.size() - 1)], hi = upper[std::min(c, upper.size() - 1)];
    if (lo > hi)
      p.fail("upper", "expected upper >= lower, got lower " + format_value(lo) + " and upper " +
                          format_value(hi) + (n > 1 ? " for channel " + std::to_string(c) : std::string()));
  }
  p.boolean("allow_missing_keys", allow_missing_keys,
            "skip keys a sample lacks (e.g. no label at inference)");
}

Result<at::Tensor> normalize_ct(const at::Tensor& x, const std::vector<double>& lower,
                                const std::vector<double>& upper, const std::vector<double>& mean,
                                const std::vector<double>& stddev) {
  constexpr double kMinStd = 1e-8;  // nnU-Net's max(std, 1e-8)
  const std::int64_t channels = x.dim() > 0 ? x.size(0) : 1;
  for (const auto* v : {&lower, &upper, &mean, &stddev})
    if (v->empty() || (v->size() != 1 && static_cast<std::int64_t>(v->size()) != channels))
      return invalid_argument("normalize_ct: " + std::to_string(v->size()) + " values for a tensor of " +
                              std::to_string(channels) + " channels; expected 1 or " +
                              std::to_string(channels));
  const at::Tensor f = detail::is_floating(x) ? x : x.to(torch::kFloat32);
  auto pick = [](const std::vector<double>& v, std::int64_t c) { return v[v.size() == 1 ? 0 : c]; };
  const bool uniform = lower.size() == 1 && upper.size() == 1 && mean.size() == 1 && stddev.size() == 1;
  if (uniform || f.dim() == 0) return (f.clamp(lower[0], upper[0]) - mean[0]) / std::max(stddev[0], kMinStd);
  std::vector<at::Tensor> out;
  for (std::int64_t c = 0; c < channels; ++c)
    out.push_back((f[c].clamp(pick(lower, c), pick(upper, c)) - pick(mean, c)) /
                  std::max(pick(stddev, c), kMinStd));
  return torch::stack(out, 0);
}

namespace {

class NormalizeCtStage final : public MapStage {
 public:
  using Options = NormalizeCtOptions;
  static constexpr const char* kName = "normalize_ct";
  static constexpr const char* kDoc =
      "nnU-Net's CT normalisation: clip to [lower, upper], then (x - mean) / max(std, 1e-8) with "
      "the dataset's foreground statistics";
  static constexpr bool kDeterministic = true;

  NormalizeCtStage(Options o, nlohmann::json resolved)
      : MapStage(kName, std::move(resolved), o.keys), o_(std::move(o)) {}
  bool deterministic() const override { return true; }

  Status apply_sample(Sample& s, Rng&) const override {
    for (const auto& k : detail::present_keys(s, o_.keys, o_.allow_missing_keys)) {
      if (!s.has(k)) return detail::check_keys(s, {k}, kName).status();
      auto y = normalize_ct(s.at(k), o_.lower, o_.upper, o_.mean, o_.stddev);
      if (!y.is_ok())
        return invalid_argument(std::string(kName) + ": sample '" + s.id + "': '" + k + "' has shape " +
                                detail::shape_string(s.at(k)) + ": " +
                                y.status().message().substr(std::string(kName).size() + 2));
      s.at(k) = std::move(y).value();
    }
    return Status::ok();
  }

 private:
  Options o_;
};

}  // namespace

Status register_normalize_ct_stage(StageRegistry& r) { return add_stage<NormalizeCtStage>(r); }

}  // namespace segflow::pipeline
