#include <torch/torch.h>

#include <cmath>

#include "pipeline/options.hpp"
#include "pipeline/stage_registry.hpp"
#include "pipeline/transforms/detail/tensor_util.hpp"
#include "pipeline/transforms/register.hpp"
#include "pipeline/transforms/spatial.hpp"

namespace segflow::pipeline {

void RandAffineOptions::bind(OptionParser& p) {
  p.strings("keys", keys, true, "tensors to warp together");
  p.number("prob", prob, Range::closed(0, 1), "", "chance of warping");
  p.numbers("rotate_range", rotate_range, Range::closed(0, 3.141592653589793), true, "radians",
            "angle about x, y, z uniform in [-r, r] (2-D samples use z)");
  p.numbers("scale_range", scale_range, Range::closed(0, 0.9), true, "",
            "zoom per axis 1 + uniform in [-s, s]");
  p.numbers("translate_range", translate_range, Range::non_negative(), true, "voxels",
            "shift per axis uniform in [-t, t]");
  p.choice("mode", mode, {"bilinear", "nearest"},
           "interpolation of floating tensors (integer ones: nearest)");
  p.choice("padding_mode", padding_mode, {"zeros", "border", "reflection"}, "values outside the input");
  p.boolean("allow_missing_keys", allow_missing_keys,
            "skip keys a sample lacks (e.g. no label at inference)");
}

bool AffineParams::identity() const {
  for (int a = 0; a < 3; ++a)
    if (rotate[a] != 0 || scale[a] != 1 || translate[a] != 0) return false;
  return true;
}

namespace {

using Mat3 = std::array<std::array<double, 3>, 3>;

Mat3 matmul(const Mat3& a, const Mat3& b) {
  Mat3 c{};
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 3; ++k) c[i][j] += a[i][k] * b[k][j];
  return c;
}

// Output voxel -> input voxel in centred voxel coordinates (x, y, z):
//   in = M * out + translate, M = R * diag(1 / scale); 2-D samples rotate about z only.
Mat3 voxel_matrix(const AffineParams& p, std::int64_t nsp) {
  Mat3 r{};
  if (nsp == 3) {
    const double cx = std::cos(p.rotate[0]), sx = std::sin(p.rotate[0]);
    const double cy = std::cos(p.rotate[1]), sy = std::sin(p.rotate[1]);
    const double cz = std::cos(p.rotate[2]), sz = std::sin(p.rotate[2]);
    const Mat3 rx{{{1, 0, 0}, {0, cx, -sx}, {0, sx, cx}}};
    const Mat3 ry{{{cy, 0, sy}, {0, 1, 0}, {-sy, 0, cy}}};
    const Mat3 rz{{{cz, -sz, 0}, {sz, cz, 0}, {0, 0, 1}}};
    r = matmul(rz, matmul(ry, rx));
  } else {
    const double c = std::cos(p.rotate[2]), s = std::sin(p.rotate[2]);
    r = Mat3{{{c, -s, 0}, {s, c, 0}, {0, 0, 1}}};
  }
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) r[i][j] = j < nsp ? r[i][j] / p.scale[j] : r[i][j];
  return r;
}

// Sampling grid (1, [D,] H, W, nsp) mapping output voxels to input voxels for `params`,
// converted from centred voxel coordinates to grid_sample's normalised ones
// (align_corners = false: centred voxel = normalised * n / 2).
at::Tensor affine_grid_for(const at::Tensor& t, const AffineParams& p) {
  const std::int64_t nsp = t.dim() - 1;
  const Size3 n = detail::spatial_size_xyz(t);
  const Mat3 m = voxel_matrix(p, nsp);
  auto theta = torch::zeros({1, nsp, nsp + 1}, torch::kFloat64);
  auto acc = theta.accessor<double, 3>();
  for (int i = 0; i < nsp; ++i) {
    const double ni = static_cast<double>(n[i]) / 2.0;
    for (int j = 0; j < nsp; ++j) acc[0][i][j] = m[i][j] * (static_cast<double>(n[j]) / 2.0) / ni;
    acc[0][i][nsp] = p.translate[i] / ni;
  }
  std::vector<std::int64_t> size{1, t.size(0)};
  for (std::int64_t d = 1; d < t.dim(); ++d) size.push_back(t.size(d));
  return torch::nn::functional::affine_grid(
      theta.to(torch::TensorOptions().dtype(torch::kFloat32).device(t.device())), size,
      /*align_corners=*/false);
}

at::Tensor warp(const at::Tensor& t, const at::Tensor& grid, bool linear, const std::string& padding_mode) {
  namespace F = torch::nn::functional;
  const bool floating = detail::is_floating(t);
  const bool keep = t.scalar_type() == torch::kFloat32 || t.scalar_type() == torch::kFloat64;
  auto opts = F::GridSampleFuncOptions().align_corners(false);
  opts = (floating && linear) ? opts.mode(torch::kBilinear) : opts.mode(torch::kNearest);
  if (padding_mode == "border")
    opts = opts.padding_mode(torch::kBorder);
  else if (padding_mode == "reflection")
    opts = opts.padding_mode(torch::kReflection);
  else
    opts = opts.padding_mode(torch::kZeros);
  at::Tensor x = keep ? t : t.to(torch::kFloat32);
  at::Tensor y = F::grid_sample(x.unsqueeze(0), grid.to(x.scalar_type()), opts).squeeze(0);
  if (!floating) return y.round().to(t.scalar_type());
  return keep ? y : y.to(t.scalar_type());
}

}  // namespace

at::Tensor affine_tensor(const at::Tensor& t, const AffineParams& params, bool linear,
                         const std::string& padding_mode) {
  if (params.identity()) return t;
  return warp(t, affine_grid_for(t, params), linear, padding_mode);
}

Geometry affine_geometry(const Geometry& g, const Size3& size, std::int64_t nsp, const AffineParams& params) {
  if (params.identity()) return g;
  const Mat3 m = voxel_matrix(params, nsp);
  // Physical point of output index o: origin + D*S*(c + t + M*(o - c)), c the centre index.
  std::array<double, 3> centre{}, moved{};
  for (int i = 0; i < 3; ++i) {
    centre[i] = (static_cast<double>(size[i]) - 1.0) / 2.0;
    moved[i] = centre[i] + (i < nsp ? params.translate[i] : 0.0);
  }
  const std::array<double, 3> centre_world = index_to_physical(g, moved);
  // A = D * diag(spacing) * M; its columns are the new axes times the new spacings.
  auto a = torch::zeros({3, 3}, torch::kFloat64);
  auto acc = a.accessor<double, 2>();
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 3; ++k) acc[i][j] += g.direction[i * 3 + k] * g.spacing[k] * m[k][j];
  Geometry out = g;
  auto dir = torch::zeros({3, 3}, torch::kFloat64);
  for (int j = 0; j < 3; ++j) {
    out.spacing[j] = a.select(1, j).norm().item<double>();
    dir.select(1, j).copy_(a.select(1, j) / out.spacing[j]);
  }
  std::array<double, 9> d{};
  for (int i = 0; i < 9; ++i) d[i] = dir.view(-1)[i].item<double>();
  if (!direction_is_orthonormal(d, 1e-9)) {
    auto [u, sv, vh] = at::linalg_svd(dir, /*full_matrices=*/false, std::nullopt);
    auto rot = u.matmul(vh);
    for (int i = 0; i < 9; ++i) d[i] = rot.view(-1)[i].item<double>();
  }
  out.direction = d;
  // Origin so that the centre index lands on the centre's physical point.
  out.origin = centre_world;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) out.origin[i] -= d[i * 3 + j] * out.spacing[j] * centre[j];
  return out;
}

namespace {

class RandAffineStage final : public MapStage {
 public:
  using Options = RandAffineOptions;
  static constexpr const char* kName = "rand_affine";
  static constexpr const char* kDoc = "random rotation, zoom and shift (affine_grid + grid_sample)";
  static constexpr bool kDeterministic = false;

  RandAffineStage(Options o, nlohmann::json resolved)
      : MapStage(kName, std::move(resolved), o.keys), o_(std::move(o)) {}
  bool deterministic() const override { return false; }

  Status apply_sample(Sample& s, Rng& rng) const override {
    const auto keys = detail::present_keys(s, o_.keys, o_.allow_missing_keys);
    if (keys.empty()) return Status::ok();
    SEGFLOW_RETURN_IF_ERROR(detail::check_keys(s, keys, kName).status());
    if (!rng.bernoulli(o_.prob)) return Status::ok();
    AffineParams p;
    for (int a = 0; a < 3; ++a) {
      p.rotate[a] = rng.uniform(-o_.rotate_range[a], o_.rotate_range[a]);
      p.scale[a] = 1.0 + rng.uniform(-o_.scale_range[a], o_.scale_range[a]);
      p.translate[a] = rng.uniform(-o_.translate_range[a], o_.translate_range[a]);
    }
    if (p.identity()) return Status::ok();
    const at::Tensor& first = s.at(keys.front());
    const at::Tensor grid = affine_grid_for(first, p);
    s.geometry = affine_geometry(s.geometry, detail::spatial_size_xyz(first), first.dim() - 1, p);
    for (const auto& k : keys) s.at(k) = warp(s.at(k), grid, o_.mode == "bilinear", o_.padding_mode);
    detail::drop_indices(s);  // foreground indices point into the unwarped grid
    return Status::ok();
  }

 private:
  Options o_;
};

}  // namespace

Status register_rand_affine_stage(StageRegistry& r) { return add_stage<RandAffineStage>(r); }

}  // namespace segflow::pipeline
