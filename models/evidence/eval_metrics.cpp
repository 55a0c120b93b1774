#include "models/evidence/eval_metrics.hpp"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <mutex>

namespace segflow::models {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

/// Squared distance transform of one line (Felzenszwalb & Huttenlocher 2012): d[q] =
/// min_p ((q - p) s)^2 + f[p] over the sites p with finite f. `v` holds n site indices, `z`
/// n + 1 boundaries of the lower envelope of the parabolas.
void squared_edt_line(const double* f, std::int64_t n, double s, double* d, std::int64_t* v, double* z) {
  std::int64_t k = -1;
  for (std::int64_t q = 0; q < n; ++q) {
    if (f[q] == kInf) continue;
    const double xq = static_cast<double>(q) * s;
    const double hq = f[q] + xq * xq;
    double cross = 0;
    while (k >= 0) {
      const double xv = static_cast<double>(v[k]) * s;
      cross = (hq - (f[v[k]] + xv * xv)) / (2.0 * (xq - xv));
      if (cross <= z[k])
        --k;
      else
        break;
    }
    if (k < 0) {
      k = 0;
      v[0] = q;
      z[0] = -kInf;
    } else {
      ++k;
      v[k] = q;
      z[k] = cross;
    }
    z[k + 1] = kInf;
  }
  if (k < 0) {
    std::fill(d, d + n, kInf);
    return;
  }
  std::int64_t j = 0;
  for (std::int64_t q = 0; q < n; ++q) {
    const double x = static_cast<double>(q) * s;
    while (z[j + 1] < x) ++j;
    const double dx = x - static_cast<double>(v[j]) * s;
    d[q] = dx * dx + f[v[j]];
  }
}

/// One separable pass of the squared EDT along an axis of a (Z, Y, X) buffer: `lines`
/// lines of `n` values `stride` apart; line l starts at start(l).
template <typename Start>
void edt_pass(double* data, std::int64_t lines, std::int64_t n, std::int64_t stride, double spacing,
              const Start& start) {
  if (n <= 1) return;  // a single site per line: nothing moves
  at::parallel_for(0, lines, std::max<std::int64_t>(1, 4096 / n), [&](std::int64_t b, std::int64_t e) {
    std::vector<double> f(n), d(n), z(n + 1);
    std::vector<std::int64_t> v(n);
    for (std::int64_t l = b; l < e; ++l) {
      double* p = data + start(l);
      for (std::int64_t i = 0; i < n; ++i) f[i] = p[i * stride];
      squared_edt_line(f.data(), n, spacing, d.data(), v.data(), z.data());
      for (std::int64_t i = 0; i < n; ++i) p[i * stride] = d[i];
    }
  });
}

/// Squared EDT in place: `data` (Z, Y, X) holds 0 at features and +inf elsewhere.
void squared_edt_3d(double* data, std::int64_t Z, std::int64_t Y, std::int64_t X, double sz, double sy,
                    double sx) {
  edt_pass(data, Z * Y, X, 1, sx, [X](std::int64_t l) { return l * X; });
  edt_pass(data, Z * X, Y, X, sy, [X, Y](std::int64_t l) { return (l / X) * Y * X + l % X; });
  edt_pass(data, Y * X, Z, Y * X, sz, [](std::int64_t l) { return l; });
}

/// (Z, Y, X) view of a (Z, Y, X), (1, Z, Y, X) or (Y, X) tensor; `two_d` when it was 2D.
at::Tensor as_zyx(const at::Tensor& t, bool& two_d, const char* what) {
  two_d = false;
  if (t.dim() == 2) {
    two_d = true;
    return t.unsqueeze(0);
  }
  if (t.dim() == 4) {
    TORCH_CHECK(t.size(0) == 1, what, ": expected one channel, got ", t.size(0));
    return t[0];
  }
  TORCH_CHECK(t.dim() == 3, what, ": expected (Z, Y, X), (1, Z, Y, X) or (Y, X), got ", t.dim(),
              " dimensions");
  return t;
}

/// Surface flags of a uint8 mask buffer (Z, Y, X); off-grid neighbours are outside; with
/// `two_d` the z neighbours are not looked at (a 2D image has none).
void surface_of(const std::uint8_t* m, std::uint8_t* out, std::int64_t Z, std::int64_t Y, std::int64_t X,
                bool two_d) {
  const std::int64_t plane = Y * X;
  at::parallel_for(0, Z, 1, [&](std::int64_t z0, std::int64_t z1) {
    for (std::int64_t z = z0; z < z1; ++z)
      for (std::int64_t y = 0; y < Y; ++y) {
        const std::int64_t row = z * plane + y * X;
        for (std::int64_t x = 0; x < X; ++x) {
          const std::int64_t i = row + x;
          if (!m[i]) {
            out[i] = 0;
            continue;
          }
          bool edge = x == 0 || x == X - 1 || y == 0 || y == Y - 1 || !m[i - 1] || !m[i + 1] || !m[i - X] ||
                      !m[i + X];
          if (!two_d && !edge) edge = z == 0 || z == Z - 1 || !m[i - plane] || !m[i + plane];
          out[i] = edge ? 1 : 0;
        }
      }
  });
}

/// Per-class tallies over the whole grid.
struct Tally {
  std::int64_t pred = 0, gt = 0, both = 0;
  std::int64_t lo[3] = {std::numeric_limits<std::int64_t>::max(), std::numeric_limits<std::int64_t>::max(),
                        std::numeric_limits<std::int64_t>::max()};
  std::int64_t hi[3] = {-1, -1, -1};
  void add_box(std::int64_t z, std::int64_t y, std::int64_t x) {
    lo[0] = std::min(lo[0], z), lo[1] = std::min(lo[1], y), lo[2] = std::min(lo[2], x);
    hi[0] = std::max(hi[0], z), hi[1] = std::max(hi[1], y), hi[2] = std::max(hi[2], x);
  }
  void merge(const Tally& o) {
    pred += o.pred, gt += o.gt, both += o.both;
    for (int a = 0; a < 3; ++a) lo[a] = std::min(lo[a], o.lo[a]), hi[a] = std::max(hi[a], o.hi[a]);
  }
};

}  // namespace

double percentile_linear(std::vector<double>& values, double q) {
  if (values.empty()) return kNaN;
  const double pos = std::clamp(q, 0.0, 100.0) / 100.0 * static_cast<double>(values.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  const auto hi = std::min(values.size() - 1, lo + 1);
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(lo), values.end());
  const double a = values[lo];
  if (hi == lo || pos == static_cast<double>(lo)) return a;
  // The next order statistic is the smallest value above position lo.
  const double b = *std::min_element(values.begin() + static_cast<std::ptrdiff_t>(lo) + 1, values.end());
  if (a == b) return a;  // also keeps inf, inf at inf
  return a + (b - a) * (pos - static_cast<double>(lo));
}

at::Tensor euclidean_distance_transform(const at::Tensor& features, const std::vector<double>& spacing) {
  bool two_d = false;
  at::Tensor f = as_zyx(features, two_d, "euclidean_distance_transform");
  std::vector<double> sp = spacing;
  TORCH_CHECK(sp.size() == static_cast<std::size_t>(two_d ? 2 : 3),
              "euclidean_distance_transform: expected one spacing per axis, got ", sp.size());
  if (two_d) sp.insert(sp.begin(), 1.0);
  for (double s : sp)
    TORCH_CHECK(s > 0 && std::isfinite(s), "euclidean_distance_transform: spacing must be > 0");
  at::Tensor out = torch::where(f.to(torch::kCPU) != 0, 0.0, kInf).to(torch::kFloat64).contiguous();
  squared_edt_3d(out.data_ptr<double>(), out.size(0), out.size(1), out.size(2), sp[0], sp[1], sp[2]);
  out.sqrt_();
  return two_d ? out[0] : out;
}

at::Tensor surface_voxels(const at::Tensor& mask) {
  bool two_d = false;
  at::Tensor m = (as_zyx(mask, two_d, "surface_voxels").to(torch::kCPU) != 0).to(torch::kByte).contiguous();
  at::Tensor out = torch::empty_like(m);
  surface_of(m.data_ptr<std::uint8_t>(), out.data_ptr<std::uint8_t>(), m.size(0), m.size(1), m.size(2),
             two_d);
  return two_d ? out[0] : out;
}

namespace {

/// Two (Z, Y, X) int32 label maps on one grid, on the CPU.
struct LabelMaps {
  const std::int32_t* pred = nullptr;
  const std::int32_t* gt = nullptr;
  std::int64_t Z = 0, Y = 0, X = 0;
};

/// Per-class counts and the bounding box of P ∪ G, in one pass over the grid.
std::vector<Tally> tally_classes(const LabelMaps& m, const std::vector<std::int64_t>& labels) {
  // Label value -> index into `labels` (-1: not scored).
  std::int64_t max_label = -1;
  for (auto l : labels) max_label = std::max(max_label, l);
  std::vector<int> lut(static_cast<std::size_t>(std::max<std::int64_t>(0, max_label + 1)), -1);
  for (std::size_t i = 0; i < labels.size(); ++i)
    if (labels[i] >= 0) lut[static_cast<std::size_t>(labels[i])] = static_cast<int>(i);
  const auto class_of = [&](std::int32_t v) {
    return v >= 0 && static_cast<std::size_t>(v) < lut.size() ? lut[static_cast<std::size_t>(v)] : -1;
  };
  const std::int64_t Y = m.Y, X = m.X, plane = Y * X;
  std::vector<Tally> tally(labels.size());
  std::mutex mu;
  at::parallel_for(0, m.Z, 1, [&](std::int64_t z0, std::int64_t z1) {
    std::vector<Tally> local(labels.size());
    for (std::int64_t z = z0; z < z1; ++z)
      for (std::int64_t y = 0; y < Y; ++y)
        for (std::int64_t x = 0; x < X; ++x) {
          const std::int64_t i = z * plane + y * X + x;
          const int cp = class_of(m.pred[i]), cg = class_of(m.gt[i]);
          if (cp >= 0) {
            ++local[cp].pred;
            local[cp].add_box(z, y, x);
          }
          if (cg >= 0) {
            ++local[cg].gt;
            if (cg == cp)
              ++local[cg].both;
            else
              local[cg].add_box(z, y, x);
          }
        }
    std::lock_guard<std::mutex> lock(mu);
    for (std::size_t c = 0; c < labels.size(); ++c) tally[c].merge(local[c]);
  });
  return tally;
}

/// HD95, ASSD and NSD of class `value` (present in both maps) from its surfaces. Everything
/// happens inside the bounding box of P ∪ G: both surfaces lie in it, and the outside of
/// the box is outside both masks.
void score_surfaces(ClassScores& s, const Tally& t, const LabelMaps& m, std::int32_t value,
                    const std::array<double, 3>& spacing_zyx, bool two_d, const EvalMetricOptions& options) {
  const std::int64_t plane = m.Y * m.X;
  const std::int64_t bz = t.hi[0] - t.lo[0] + 1, by = t.hi[1] - t.lo[1] + 1, bx = t.hi[2] - t.lo[2] + 1;
  const std::int64_t n = bz * by * bx;
  std::vector<std::uint8_t> mp(n), mg(n), ep(n), eg(n);
  at::parallel_for(0, bz, 1, [&](std::int64_t z0, std::int64_t z1) {
    for (std::int64_t z = z0; z < z1; ++z)
      for (std::int64_t y = 0; y < by; ++y) {
        const std::int64_t src = (z + t.lo[0]) * plane + (y + t.lo[1]) * m.X + t.lo[2];
        const std::int64_t dst = (z * by + y) * bx;
        for (std::int64_t x = 0; x < bx; ++x) {
          mp[dst + x] = m.pred[src + x] == value;
          mg[dst + x] = m.gt[src + x] == value;
        }
      }
  });
  surface_of(mp.data(), ep.data(), bz, by, bx, two_d);
  surface_of(mg.data(), eg.data(), bz, by, bx, two_d);
  // Distances from the surface voxels of `from` to the surface of `to`.
  std::vector<double> field(n);
  const auto directed = [&](const std::vector<std::uint8_t>& from, const std::vector<std::uint8_t>& to) {
    for (std::int64_t i = 0; i < n; ++i) field[i] = to[i] ? 0.0 : kInf;
    squared_edt_3d(field.data(), bz, by, bx, spacing_zyx[0], spacing_zyx[1], spacing_zyx[2]);
    std::vector<double> d;
    for (std::int64_t i = 0; i < n; ++i)
      if (from[i]) d.push_back(std::sqrt(field[i]));
    return d;
  };
  std::vector<double> d_pg = directed(ep, eg), d_gp = directed(eg, ep);
  double sum = 0;
  std::int64_t within = 0;
  for (const auto* d : {&d_pg, &d_gp})
    for (double v : *d) {
      sum += v;
      within += v <= options.tolerance_mm;
    }
  const double total = static_cast<double>(d_pg.size() + d_gp.size());
  s.assd = sum / total;
  s.nsd = static_cast<double>(within) / total;
  s.hd95 = std::max(percentile_linear(d_pg, options.percentile), percentile_linear(d_gp, options.percentile));
}

}  // namespace

std::vector<ClassScores> score_label_maps(const at::Tensor& pred_in, const at::Tensor& gt_in,
                                          const std::vector<std::int64_t>& labels,
                                          const std::vector<double>& spacing_xyz,
                                          const EvalMetricOptions& options) {
  bool two_d_p = false, two_d_g = false;
  at::Tensor pred = as_zyx(pred_in, two_d_p, "pred"), gt = as_zyx(gt_in, two_d_g, "gt");
  TORCH_CHECK(pred.sizes() == gt.sizes(), "score_label_maps: pred ", pred.sizes(), " and gt ", gt.sizes(),
              " differ in shape");
  const bool two_d = two_d_p;
  TORCH_CHECK(spacing_xyz.size() == static_cast<std::size_t>(two_d ? 2 : 3),
              "score_label_maps: expected one spacing per axis, got ", spacing_xyz.size());
  for (double s : spacing_xyz)
    TORCH_CHECK(s > 0 && std::isfinite(s), "score_label_maps: spacing must be > 0");
  TORCH_CHECK(options.tolerance_mm >= 0, "score_label_maps: tolerance_mm must be >= 0");
  TORCH_CHECK(!at::isFloatingType(pred.scalar_type()) && !at::isFloatingType(gt.scalar_type()),
              "score_label_maps: expected integer label maps");
  const double sx = spacing_xyz[0], sy = spacing_xyz[1], sz = two_d ? 1.0 : spacing_xyz[2];
  const double voxel_ml = sx * sy * (two_d ? 1.0 : sz) / 1000.0;

  pred = pred.to(torch::kCPU, torch::kInt32).contiguous();
  gt = gt.to(torch::kCPU, torch::kInt32).contiguous();
  const LabelMaps maps{pred.data_ptr<std::int32_t>(), gt.data_ptr<std::int32_t>(), pred.size(0), pred.size(1),
                       pred.size(2)};
  const std::vector<Tally> tally = tally_classes(maps, labels);

  std::vector<ClassScores> out;
  out.reserve(labels.size());
  for (std::size_t c = 0; c < labels.size(); ++c) {
    const Tally& t = tally[c];
    ClassScores s;
    s.label = labels[c];
    s.voxels_pred = t.pred;
    s.voxels_gt = t.gt;
    s.volume_pred_ml = static_cast<double>(t.pred) * voxel_ml;
    s.volume_gt_ml = static_cast<double>(t.gt) * voxel_ml;
    if (t.pred == 0 && t.gt == 0) {
      s.dice = s.iou = 1.0;
      s.hd95 = s.assd = s.nsd = kNaN;
    } else {
      s.dice = 2.0 * static_cast<double>(t.both) / static_cast<double>(t.pred + t.gt);
      s.iou = static_cast<double>(t.both) / static_cast<double>(t.pred + t.gt - t.both);
      if (t.pred == 0 || t.gt == 0) {
        s.hd95 = s.assd = kInf;
        s.nsd = 0.0;
      } else {
        score_surfaces(s, t, maps, static_cast<std::int32_t>(labels[c]), {sz, sy, sx}, two_d, options);
      }
    }
    out.push_back(s);
  }
  return out;
}

}  // namespace segflow::models
