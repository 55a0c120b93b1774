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
  p.numbers("scale_range", scale_range, Range::closed(0, 0.9), true, "", "zoom per axis 1 + uniform in [-s, s]");
  p.numbers("translate_range", translate_range, Range::non_negative(), true, "voxels",
            "shift per axis uniform in [-t, t]");
  p.choice("mode", mode, {"bilinear", "nearest"}, "interpolation of floating tensors (integer ones: nearest)");
  p.choice("padding_mode", padding_mode, {"zeros", "border", "reflection"}, "values outside the input");
  p.boolean("allow_missing_keys", allow_missing_keys, "skip keys a sample lacks (e.g. no label at inference)");
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

// Sampling grid (1, [D,] H, W, nsp) mapping output voxels to input voxels for `params`,
// built in centred voxel coordinates and converted to grid_sample's normalised ones
// (align_corners = false: centred voxel = normalised * n / 2).
at::Tensor affine_grid_for(const at::Tensor& t, const AffineParams& p) {
  const std::int64_t nsp = t.dim() - 1;
  const Size3 n = detail::spatial_size_xyz(t);
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
  // theta = N^-1 * R * diag(1/scale) * N, offset N^-1 * translate.
  auto theta = torch::zeros({1, nsp, nsp + 1}, torch::kFloat64);
  auto acc = theta.accessor<double, 3>();
  for (int i = 0; i < nsp; ++i) {
    const double ni = static_cast<double>(n[i]) / 2.0;
    for (int j = 0; j < nsp; ++j) acc[0][i][j] = r[i][j] / p.scale[j] * (static_cast<double>(n[j]) / 2.0) / ni;
    acc[0][i][nsp] = p.translate[i] / ni;
  }
  std::vector<std::int64_t> size{1, t.size(0)};
  for (std::int64_t d = 1; d < t.dim(); ++d) size.push_back(t.size(d));
  return torch::nn::functional::affine_grid(theta.to(torch::TensorOptions().dtype(torch::kFloat32).device(t.device())),
                                            size, /*align_corners=*/false);
}

at::Tensor warp(const at::Tensor& t, const at::Tensor& grid, bool linear, const std::string& padding_mode) {
  namespace F = torch::nn::functional;
  const bool floating = detail::is_floating(t);
  const bool keep = t.scalar_type() == torch::kFloat32 || t.scalar_type() == torch::kFloat64;
  auto opts = F::GridSampleFuncOptions().align_corners(false);
  opts = (floating && linear) ? opts.mode(torch::kBilinear) : opts.mode(torch::kNearest);
  if (padding_mode == "border") opts = opts.padding_mode(torch::kBorder);
  else if (padding_mode == "reflection") opts = opts.padding_mode(torch::kReflection);
  else opts = opts.padding_mode(torch::kZeros);
  at::Tensor x = keep ? t : t.to(torch::kFloat32);
  at::Tensor y = F::grid_sample(x.unsqueeze(0), grid.to(x.scalar_type()), opts).squeeze(0);
  if (!floating) return y.round().to(t.scalar_type());
  return keep ? y : y.to(t.scalar_type());
}

}  // namespace

at::Tensor affine_tensor(const at::Tensor& t, const AffineParams& params, bool linear, const std::string& padding_mode) {
  if (params.identity()) return t;
  return warp(t, affine_grid_for(t, params), linear, padding_mode);
}

namespace {

class RandAffineStage final : public MapStage {
 public:
  using Options = RandAffineOptions;
  static constexpr const char* kName = "rand_affine";
  static constexpr const char* kDoc = "random rotation, zoom and shift (affine_grid + grid_sample)";
  static constexpr bool kDeterministic = false;

  RandAffineStage(Options o, nlohmann::json resolved) : MapStage(kName, std::move(resolved), o.keys), o_(std::move(o)) {}
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
    const at::Tensor grid = affine_grid_for(s.at(keys.front()), p);
    for (const auto& k : keys) s.at(k) = warp(s.at(k), grid, o_.mode == "bilinear", o_.padding_mode);
    detail::drop_indices(s);  // geometry: the warped grid is no longer the scanner's; kept as is
    return Status::ok();
  }

 private:
  Options o_;
};

}  // namespace

Status register_rand_affine_stage(StageRegistry& r) { return add_stage<RandAffineStage>(r); }

}  // namespace segflow::pipeline
