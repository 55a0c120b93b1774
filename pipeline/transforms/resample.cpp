#include <torch/torch.h>

#include <cmath>

#include "pipeline/options.hpp"
#include "pipeline/stage_registry.hpp"
#include "pipeline/transforms/detail/tensor_util.hpp"
#include "pipeline/transforms/register.hpp"
#include "pipeline/transforms/spatial.hpp"

namespace segflow::pipeline {

void ResampleOptions::bind(OptionParser& p) {
  p.strings("keys", keys, true, "tensors to resample (same grid)");
  p.numbers("spacing", spacing, Range::positive(), false, "mm", "target spacing (x, y, z)");
  p.choice("mode", mode, {"trilinear", "nearest"},
           "interpolation of floating tensors (integer ones: nearest)");
  p.choice("grid", grid, {"keep_extent", "exact_spacing"},
           "keep_extent: round(n * spacing / target) voxels over the same field of view (the spacing "
           "within half a voxel of the target); exact_spacing: MONAI's Spacingd grid, the spacing exactly "
           "the target, the first voxel centre kept, round((n - 1) * spacing / target) + 1 voxels");
  p.boolean("allow_missing_keys", allow_missing_keys,
            "skip keys a sample lacks (e.g. no label at inference)");
}

Size3 resampled_size(const Size3& size, const std::array<double, 3>& spacing,
                     const std::array<double, 3>& target) {
  Size3 out{};
  for (int a = 0; a < 3; ++a)
    out[a] = std::max<std::int64_t>(1, std::llround(static_cast<double>(size[a]) * spacing[a] / target[a]));
  return out;
}

at::Tensor resample_tensor(const at::Tensor& t, const Size3& size, bool linear) {
  const std::vector<std::int64_t> out{size[2], size[1], size[0]};
  if (t.size(1) == out[0] && t.size(2) == out[1] && t.size(3) == out[2]) return t;
  if (linear && detail::is_floating(t)) return detail::resize_linear(t, out).contiguous();
  return detail::resize_nearest(t, out).contiguous();
}

Geometry resample_geometry(const Geometry& g, const Size3& from, const Size3& to) {
  Geometry out = g;
  std::array<double, 3> first{};
  for (int a = 0; a < 3; ++a) {
    const double ratio = static_cast<double>(from[a]) / static_cast<double>(to[a]);
    out.spacing[a] = g.spacing[a] * ratio;
    first[a] = 0.5 * ratio - 0.5;  // old continuous index of the new voxel 0 (centres aligned)
  }
  out.origin = index_to_physical(g, first);
  return out;
}

Size3 exact_spacing_size(const Size3& size, const std::array<double, 3>& spacing,
                         const std::array<double, 3>& target) {
  Size3 out{};
  for (int a = 0; a < 3; ++a)
    out[a] = std::max<std::int64_t>(
        1, std::llround(static_cast<double>(size[a] - 1) * spacing[a] / target[a]) + 1);
  return out;
}

at::Tensor resample_tensor_exact(const at::Tensor& t, const Size3& size, const std::array<double, 3>& spacing,
                                 const std::array<double, 3>& target, bool linear) {
  linear = linear && detail::is_floating(t);
  const auto dtype = t.scalar_type();
  at::Tensor r = linear && dtype != at::kDouble ? t.to(at::kFloat) : t;
  for (int a = 0; a < 3; ++a) {
    const std::int64_t dim = 3 - a;  // x is the last tensor dim
    const std::int64_t n = r.size(dim), m = size[a];
    auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
    // Old continuous index of each new voxel; past the last old voxel: its value (MONAI's
    // "border" padding).
    at::Tensor pos = (torch::arange(m, f64) * (target[a] / spacing[a])).clamp(0, static_cast<double>(n - 1));
    if (!linear) {
      r = r.index_select(dim, pos.round().to(torch::kLong).to(t.device()));
      continue;
    }
    at::Tensor lo = pos.floor();
    at::Tensor w = (pos - lo).to(r.scalar_type()).to(t.device());
    at::Tensor i0 = lo.to(torch::kLong), i1 = (i0 + 1).clamp_max(n - 1);
    std::vector<std::int64_t> shape(static_cast<std::size_t>(r.dim()), 1);
    shape[static_cast<std::size_t>(dim)] = m;
    w = w.view(shape);
    at::Tensor a0 = r.index_select(dim, i0.to(t.device())), a1 = r.index_select(dim, i1.to(t.device()));
    r = a0 + (a1 - a0) * w;
  }
  if (linear && r.scalar_type() != dtype) r = r.to(dtype);
  return r.contiguous();
}

namespace {

/// True when every axis of `spacing` is `target` to 1e-6 relative.
bool same_spacing(const std::array<double, 3>& spacing, const std::array<double, 3>& target) {
  for (int a = 0; a < 3; ++a)
    if (std::abs(spacing[a] - target[a]) > 1e-6 * target[a]) return false;
  return true;
}

class ResampleStage final : public MapStage {
 public:
  using Options = ResampleOptions;
  static constexpr const char* kName = "resample";
  static constexpr const char* kDoc = "resample to a target spacing (trilinear images, nearest labels)";
  static constexpr bool kDeterministic = true;

  ResampleStage(Options o, nlohmann::json resolved)
      : MapStage(kName, std::move(resolved), o.keys), o_(std::move(o)) {}
  bool deterministic() const override { return true; }

  Status apply_sample(Sample& s, Rng&) const override {
    const auto keys = detail::present_keys(s, o_.keys, o_.allow_missing_keys);
    if (keys.empty()) return Status::ok();
    SEGFLOW_RETURN_IF_ERROR(detail::check_keys(s, keys, kName, true).status());
    const Size3 from = detail::spatial_size_xyz(s.at(keys.front()));
    if (o_.grid == "exact_spacing") {
      if (same_spacing(s.geometry.spacing, o_.spacing)) return Status::ok();  // identity, exactly
      const Size3 to = exact_spacing_size(from, s.geometry.spacing, o_.spacing);
      for (const auto& k : keys)
        s.at(k) = resample_tensor_exact(s.at(k), to, s.geometry.spacing, o_.spacing, o_.mode == "trilinear");
      s.geometry.spacing = o_.spacing;  // origin and direction: the first voxel stays where it was
      detail::drop_indices(s);
      return Status::ok();
    }
    const Size3 to = resampled_size(from, s.geometry.spacing, o_.spacing);
    if (from == to) return Status::ok();  // same grid: identity, exactly
    for (const auto& k : keys) s.at(k) = resample_tensor(s.at(k), to, o_.mode == "trilinear");
    s.geometry = resample_geometry(s.geometry, from, to);
    detail::drop_indices(s);
    return Status::ok();
  }

 private:
  Options o_;
};

}  // namespace

Status register_resample_stage(StageRegistry& r) { return add_stage<ResampleStage>(r); }

}  // namespace segflow::pipeline
