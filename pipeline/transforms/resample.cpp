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

at::Tensor resample_to_grid(const at::Tensor& data, const Geometry& src, const Geometry& dst,
                            const Size3& dst_size) {
  torch::NoGradGuard ng;
  // Continuous source index of a destination index: i_s = A i_d + b.
  double A[3][3], b[3];
  double od[3];
  for (int r = 0; r < 3; ++r) od[r] = dst.origin[r] - src.origin[r];
  for (int r = 0; r < 3; ++r) {
    b[r] = 0;
    for (int k = 0; k < 3; ++k) b[r] += src.direction[k * 3 + r] * od[k];
    b[r] /= src.spacing[r];
    for (int c = 0; c < 3; ++c) {
      double m = 0;
      for (int k = 0; k < 3; ++k) m += src.direction[k * 3 + r] * dst.direction[k * 3 + c];
      A[r][c] = m * dst.spacing[c] / src.spacing[r];
    }
  }
  const bool integral = !at::isFloatingType(data.scalar_type());
  const std::int64_t sx = data.size(3), sy = data.size(2), sz = data.size(1);
  const std::int64_t nx = dst_size[0], ny = dst_size[1], nz = dst_size[2];
  at::Tensor src_f = data.to(at::kFloat).unsqueeze(0);  // (1, C, Z, Y, X)
  auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(data.device());
  at::Tensor out = torch::empty({data.size(0), nz, ny, nx}, opts);
  auto ix = torch::arange(nx, opts).view({1, 1, nx});
  auto iy = torch::arange(ny, opts).view({1, ny, 1});
  const std::int64_t slab = std::max<std::int64_t>(1, (8LL << 20) / std::max<std::int64_t>(1, nx * ny));
  const double size_s[3] = {static_cast<double>(sx), static_cast<double>(sy), static_cast<double>(sz)};
  for (std::int64_t z0 = 0; z0 < nz; z0 += slab) {
    const std::int64_t z1 = std::min(nz, z0 + slab);
    auto iz = torch::arange(z0, z1, opts).view({z1 - z0, 1, 1});
    std::vector<at::Tensor> coords;
    for (int r = 0; r < 3; ++r) {
      at::Tensor c = A[r][0] * ix + A[r][1] * iy + A[r][2] * iz + b[r];
      // align_corners=true normalisation; a single-voxel axis maps everything near it to 0.
      c = size_s[r] > 1 ? c * (2.0 / (size_s[r] - 1)) - 1.0 : c * 2.0;
      coords.push_back(c.expand({z1 - z0, ny, nx}));
    }
    at::Tensor grid = torch::stack(coords, -1).unsqueeze(0);  // (1, z, y, x, 3) in (x, y, z)
    torch::nn::functional::GridSampleFuncOptions::mode_t mode = torch::kBilinear;
    if (integral) mode = torch::kNearest;
    at::Tensor r = torch::nn::functional::grid_sample(src_f, grid,
                                                      torch::nn::functional::GridSampleFuncOptions()
                                                          .mode(mode)
                                                          .padding_mode(torch::kZeros)
                                                          .align_corners(true));
    out.slice(1, z0, z1).copy_(r[0]);
  }
  return integral ? out.round().to(data.scalar_type()) : out;
}

}  // namespace segflow::pipeline
