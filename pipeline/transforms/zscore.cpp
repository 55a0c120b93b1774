// zscore: nnU-Net's ZScoreNormalization (per channel; optionally over the non-zero region).
//
// How it differs from normalize_intensity (MONAI's NormalizeIntensity), so it is not an alias:
// - nonzero: nnU-Net's mask is one region for all channels, "any channel non-zero" with its
//   holes filled (create_nonzero_mask), and zero voxels inside it are normalised too;
//   normalize_intensity's nonzero takes each channel's own x != 0 and keeps every zero at 0.
// - the divisor is max(std, 1e-8) (nnU-Net); normalize_intensity divides by 1 when std is 0.
// Without nonzero and with std > 1e-8 the two give the same values (both per channel,
// population std, statistics in float64).
#include <torch/torch.h>

#include <cstdint>
#include <deque>
#include <vector>

#include "pipeline/options.hpp"
#include "pipeline/stage_registry.hpp"
#include "pipeline/transforms/detail/tensor_util.hpp"
#include "pipeline/transforms/intensity.hpp"
#include "pipeline/transforms/register.hpp"

namespace segflow::pipeline {

void ZScoreOptions::bind(OptionParser& p) {
  p.strings("keys", keys, true, "tensors to normalise");
  p.boolean("nonzero", nonzero,
            "statistics over the non-zero region (any channel != 0, holes filled: nnU-Net's "
            "use_mask_for_norm); voxels outside stay 0");
  p.boolean("allow_missing_keys", allow_missing_keys,
            "skip keys a sample lacks (e.g. no label at inference)");
}

namespace {

/// Marks (in `outside`) the false voxels of `mask` connected to the border through faces:
/// a breadth-first fill seeded with every false voxel on the border of the grid.
void fill_from_border(const std::uint8_t* mask, std::uint8_t* outside,
                      const std::vector<std::int64_t>& shape) {
  const std::size_t nd = shape.size();
  std::vector<std::int64_t> stride(nd, 1);
  for (std::size_t d = nd - 1; d > 0; --d) stride[d - 1] = stride[d] * shape[d];
  const std::int64_t n = stride[0] * shape[0];
  std::deque<std::int64_t> queue;
  auto coord = [&](std::int64_t i, std::size_t d) { return (i / stride[d]) % shape[d]; };
  auto visit = [&](std::int64_t i) {
    if (!mask[i] && !outside[i]) {
      outside[i] = 1;
      queue.push_back(i);
    }
  };
  for (std::int64_t i = 0; i < n; ++i)
    for (std::size_t d = 0; d < nd; ++d) {
      const std::int64_t c = coord(i, d);
      if (c == 0 || c == shape[d] - 1) {
        visit(i);
        break;
      }
    }
  while (!queue.empty()) {
    const std::int64_t i = queue.front();
    queue.pop_front();
    for (std::size_t d = 0; d < nd; ++d) {
      const std::int64_t c = coord(i, d);
      if (c > 0) visit(i - stride[d]);
      if (c < shape[d] - 1) visit(i + stride[d]);
    }
  }
}

}  // namespace

at::Tensor nonzero_region(const at::Tensor& x) {
  const at::Tensor any = x.ne(0).any(0);
  if (any.dim() == 0) return any;
  const at::Tensor mask = any.to(torch::kCPU).to(torch::kUInt8).contiguous();
  at::Tensor outside = torch::zeros_like(mask);
  if (mask.numel() > 0)
    fill_from_border(mask.data_ptr<std::uint8_t>(), outside.data_ptr<std::uint8_t>(), mask.sizes().vec());
  return outside.logical_not().to(x.device());
}

namespace {
at::Tensor zscore_channel(const at::Tensor& x, const at::Tensor& region) {
  constexpr double kMinStd = 1e-8;  // nnU-Net's max(std, 1e-8)
  const at::Tensor xs = region.defined() ? x.masked_select(region) : x.flatten();
  if (xs.numel() == 0) return x.clone();
  const at::Tensor xd = xs.to(torch::kFloat64);
  const at::Tensor mean = xd.mean(), std = xd.std(/*unbiased=*/false).clamp_min(kMinStd);
  at::Tensor y = ((x.to(torch::kFloat64) - mean) / std).to(x.scalar_type());
  if (region.defined()) y = torch::where(region, y, x);
  return y;
}
}  // namespace

at::Tensor zscore(const at::Tensor& x, bool nonzero) {
  const at::Tensor f = detail::is_floating(x) ? x : x.to(torch::kFloat32);
  if (f.dim() == 0) return zscore_channel(f, at::Tensor());
  const at::Tensor region = nonzero ? nonzero_region(f) : at::Tensor();
  std::vector<at::Tensor> out;
  for (std::int64_t c = 0; c < f.size(0); ++c) out.push_back(zscore_channel(f[c], region));
  return torch::stack(out, 0);
}

namespace {

class ZScoreStage final : public MapStage {
 public:
  using Options = ZScoreOptions;
  static constexpr const char* kName = "zscore";
  static constexpr const char* kDoc =
      "nnU-Net's z-score per channel: (x - mean) / max(std, 1e-8), optionally over the non-zero region";
  static constexpr bool kDeterministic = true;

  ZScoreStage(Options o, nlohmann::json resolved)
      : MapStage(kName, std::move(resolved), o.keys), o_(std::move(o)) {}
  bool deterministic() const override { return true; }

  Status apply_sample(Sample& s, Rng&) const override {
    for (const auto& k : detail::present_keys(s, o_.keys, o_.allow_missing_keys)) {
      if (!s.has(k)) return detail::check_keys(s, {k}, kName).status();
      s.at(k) = zscore(s.at(k), o_.nonzero);
    }
    return Status::ok();
  }

 private:
  Options o_;
};

}  // namespace

Status register_zscore_stage(StageRegistry& r) { return add_stage<ZScoreStage>(r); }

}  // namespace segflow::pipeline
