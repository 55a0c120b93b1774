#pragma once
// Private helpers of the random intensity stages: the floating-type check, factor draws
// (FactorSampling), the `sampling` option, and RandChannelStage, the base of the stages that
// change the channels of a tensor one at a time with their own draws (nnU-Net's
// augmentations: p per sample, then p per channel, parameters per channel).

#include <ATen/core/Tensor.h>

#include <array>
#include <string>
#include <utility>
#include <vector>

#include "messages/sample.hpp"
#include "messages/status.hpp"
#include "pipeline/stage.hpp"
#include "pipeline/transforms/detail/tensor_util.hpp"
#include "pipeline/transforms/intensity.hpp"

namespace segflow::pipeline::detail {

/// Checks that every key exists and holds a floating tensor. Errors: "<stage>: sample 'id':
/// 'label' is Byte; intensity stages need floating tensors".
Status check_floating(const Sample& s, const std::vector<std::string>& keys, const char* stage);

/// Checks that s[key] is (C, Y, X) or (C, Z, Y, X). Errors: "<stage>: sample 'id': 'image'
/// has shape (5,); expected (C, Y, X) or (C, Z, Y, X)".
Status check_image_dims(const Sample& s, const std::string& key, const char* stage);

/// A factor in [range[0], range[1]] (see FactorSampling): one draw (uniform), two (halves).
double draw_factor(Rng& rng, const std::array<double, 2>& range, FactorSampling sampling);

/// Reads option `sampling` into `field` ("uniform" | "halves"). With halves the range read
/// as option `range_key` must hold 1 (lo <= 1 <= hi); the error names `range_key`.
void bind_sampling(OptionParser& p, FactorSampling& field, const std::array<double, 2>& range,
                   const char* range_key);

/// Reads option `key` as [lo, hi] with lo <= hi, each in `range`.
void bind_interval(OptionParser& p, const char* key, std::array<double, 2>& field, Range range,
                   const char* unit, const char* doc);

/// The base of a random stage acting channel by channel on floating tensors. `Opts` has keys,
/// allow_missing_keys, prob and prob_per_channel. `Derived` provides kName and
///   Params draw(Rng&, const at::Tensor& x) const;            // x: the whole (C, ...) tensor
///   at::Tensor map(const at::Tensor& channel, const Params&) const;  // channel: (...)
/// and may hide check_tensor (a shape check of each key's tensor before anything is drawn).
/// Draws: one bernoulli(prob) per sample; if it hits, per key in order and per channel in
/// order, one bernoulli(prob_per_channel) and, when that hits, draw(). The input tensors are
/// not written to: a changed tensor is a new one.
template <class Derived, class Opts>
class RandChannelStage : public MapStage {
 public:
  using Options = Opts;
  static constexpr bool kDeterministic = false;
  RandChannelStage(Options o, nlohmann::json resolved)
      : MapStage(Derived::kName, std::move(resolved), o.keys), o_(std::move(o)) {}
  bool deterministic() const override { return false; }
  /// Any tensor of a floating type is fine unless Derived hides this.
  Status check_tensor(const Sample&, const std::string&) const { return Status::ok(); }

  Status apply_sample(Sample& s, Rng& rng) const override {
    const auto keys = present_keys(s, o_.keys, o_.allow_missing_keys);
    SEGFLOW_RETURN_IF_ERROR(check_floating(s, keys, Derived::kName));
    const auto& self = static_cast<const Derived&>(*this);
    for (const auto& k : keys) SEGFLOW_RETURN_IF_ERROR(self.check_tensor(s, k));
    if (!rng.bernoulli(o_.prob)) return Status::ok();
    for (const auto& k : keys) {
      const at::Tensor x = s.at(k);
      if (x.dim() < 1) continue;
      at::Tensor out;
      for (std::int64_t c = 0; c < x.size(0); ++c) {
        if (!rng.bernoulli(o_.prob_per_channel)) continue;
        const auto params = self.draw(rng, x);
        if (!out.defined()) out = x.clone();
        out.select(0, c).copy_(self.map(x.select(0, c), params));
      }
      if (out.defined()) s.at(k) = out;
    }
    return Status::ok();
  }

 protected:
  Options o_;
};

}  // namespace segflow::pipeline::detail
