#include "models/planning/nnunet_rules.hpp"

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <numeric>

namespace segflow::models::planning {

double py_round(double v) {
  // std::nearbyint rounds half to even in the default rounding mode, as Python's round().
  return std::nearbyint(v);
}

double np_percentile(std::vector<double> values, double q) {
  if (values.empty()) return NAN;
  std::sort(values.begin(), values.end());
  const double h = q / 100.0 * static_cast<double>(values.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(h));
  const std::size_t hi = std::min(lo + 1, values.size() - 1);
  const double t = h - static_cast<double>(lo), a = values[lo], b = values[hi];
  // numpy's _lerp: a + (b - a) * t, computed from b's side for t >= 0.5.
  return t >= 0.5 ? b - (b - a) * (1.0 - t) : a + (b - a) * t;
}

std::vector<std::int64_t> pad_shape(const std::vector<double>& shape,
                                    const std::vector<std::int64_t>& divisor) {
  std::vector<std::int64_t> out;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    const auto m = static_cast<double>(divisor[i]);
    double s = shape[i] + m - std::fmod(shape[i], m);
    if (std::fmod(shape[i], m) == 0) s -= m;
    out.push_back(static_cast<std::int64_t>(s));  // astype(int): truncation
  }
  return out;
}

Topology pool_and_conv_props(const std::vector<double>& spacing, const std::vector<double>& patch_size,
                             std::int64_t min_fm, std::int64_t max_numpool) {
  const std::size_t dim = spacing.size();
  std::vector<double> sp = spacing, size = patch_size;
  Topology t;
  t.pool_op_kernel_sizes.push_back(std::vector<std::int64_t>(dim, 1));
  t.num_pool_per_axis.assign(dim, 0);
  std::vector<std::int64_t> kernel(dim, 1);
  const double min_edge = static_cast<double>(min_fm);
  while (true) {
    std::vector<std::size_t> valid;
    for (std::size_t i = 0; i < dim; ++i)
      if (size[i] >= 2 * min_edge) valid.push_back(i);
    if (valid.empty()) break;
    double min_valid = INFINITY;
    for (auto i : valid) min_valid = std::min(min_valid, sp[i]);
    std::vector<std::size_t> v2;
    for (auto i : valid)
      if (sp[i] / min_valid < 2 && t.num_pool_per_axis[i] < max_numpool) v2.push_back(i);
    if (v2.size() == 1 && !(size[v2[0]] >= 3 * min_edge)) break;
    if (v2.empty()) break;
    const double min_all = *std::min_element(sp.begin(), sp.end());
    for (std::size_t d = 0; d < dim; ++d)
      if (kernel[d] != 3 && sp[d] / min_all < 2) kernel[d] = 3;
    std::vector<std::int64_t> pool(dim, 1);
    for (auto v : v2) {
      pool[v] = 2;
      t.num_pool_per_axis[v] += 1;
      sp[v] *= 2;
      size[v] = std::ceil(size[v] / 2);
    }
    t.pool_op_kernel_sizes.push_back(pool);
    t.conv_kernel_sizes.push_back(kernel);
  }
  for (auto n : t.num_pool_per_axis) t.must_be_divisible_by.push_back(std::int64_t{1} << n);
  t.patch_size = pad_shape(patch_size, t.must_be_divisible_by);
  t.conv_kernel_sizes.push_back(std::vector<std::int64_t>(dim, 3));  // the bottleneck
  return t;
}

std::vector<std::int64_t> features_per_stage(std::int64_t n_stages, std::int64_t base, std::int64_t max) {
  std::vector<std::int64_t> out;
  for (std::int64_t s = 0; s < n_stages; ++s) out.push_back(std::min(max, base << s));
  return out;
}

namespace {

double voxels(std::int64_t c, const std::vector<std::int64_t>& s) {
  double p = static_cast<double>(c);
  for (auto v : s) p *= static_cast<double>(v);
  return p;
}

std::vector<std::int64_t> divided(const std::vector<std::int64_t>& size,
                                  const std::vector<std::int64_t>& by) {
  std::vector<std::int64_t> out(size.size());
  for (std::size_t i = 0; i < size.size(); ++i) out[i] = size[i] / by[i];
  return out;
}

/// UNetDecoder.compute_conv_feature_map_size: per decoder stage (deepest first) its convs, the
/// transposed conv and the segmentation output, at the size of the skip it joins.
double decoder_feature_map_size(const std::vector<std::int64_t>& patch, const Topology& t,
                                const std::vector<std::int64_t>& features, std::int64_t num_classes,
                                std::int64_t convs, bool deep_supervision) {
  const std::size_t n = t.pool_op_kernel_sizes.size();
  std::vector<std::vector<std::int64_t>> skip_sizes;
  std::vector<std::int64_t> size = patch;
  for (std::size_t s = 0; s + 1 < n; ++s) {
    size = divided(size, t.pool_op_kernel_sizes[s]);
    skip_sizes.push_back(size);
  }
  double out = 0;
  for (std::size_t s = 0; s + 1 < n; ++s) {
    const auto& skip = skip_sizes[skip_sizes.size() - 1 - s];
    const std::int64_t ch = features[n - 2 - s];
    out += static_cast<double>(convs) * voxels(ch, skip);
    out += voxels(ch, skip);
    if (deep_supervision || s == n - 2) out += voxels(num_classes, skip);
  }
  return out;
}

}  // namespace

double conv_feature_map_size(const std::vector<std::int64_t>& patch, const Topology& t,
                             const std::vector<std::int64_t>& features, std::int64_t num_classes,
                             std::int64_t convs, bool deep_supervision) {
  // Encoder: stage s's first conv has the stride; every conv outputs features[s] maps.
  double out = 0;
  std::vector<std::int64_t> size = patch;
  for (std::size_t s = 0; s < t.pool_op_kernel_sizes.size(); ++s) {
    size = divided(size, t.pool_op_kernel_sizes[s]);
    out += static_cast<double>(convs) * voxels(features[s], size);
  }
  return out + decoder_feature_map_size(patch, t, features, num_classes, convs, deep_supervision);
}

double res_enc_feature_map_size(const std::vector<std::int64_t>& patch, const Topology& t,
                                const std::vector<std::int64_t>& features, std::int64_t num_classes,
                                const std::vector<std::int64_t>& blocks, std::int64_t decoder_convs,
                                bool deep_supervision) {
  double out = voxels(features[0], patch);  // the stem: one conv, stride 1
  std::vector<std::int64_t> size = patch;
  std::int64_t in = features[0];
  for (std::size_t s = 0; s < t.pool_op_kernel_sizes.size(); ++s) {
    const auto after = divided(size, t.pool_op_kernel_sizes[s]);
    const double maps = voxels(features[s], after);
    // The first block: two convs, and its skip's output when it pools or projects.
    out += 2 * maps + ((in != features[s] || after != size) ? maps : 0.0);
    out += 2 * maps * static_cast<double>(blocks[s] - 1);  // the others: two convs each
    size = after;
    in = features[s];
  }
  return out + decoder_feature_map_size(patch, t, features, num_classes, decoder_convs, deep_supervision);
}

std::string fmt_percent(double share) { return std::to_string(std::llround(share * 100.0)) + "%"; }

namespace {

struct Preset {
  const char* name;
  const char* planner;  ///< nnU-Net's class
  const char* plans;    ///< its plans_name
  double memory_gb;
  NnunetConstants constants;
};

NnunetConstants res_enc(double ref_3d, double ref_2d, double corresp_gb) {
  NnunetConstants k;
  k.residual_encoder = true;
  k.estimate_per_batch_of_2 = false;
  k.reference_val_3d = ref_3d;
  k.reference_val_2d = ref_2d;
  k.reference_val_corresp_gb = corresp_gb;
  k.max_dataset_covered = 1.0;
  return k;
}

/// nnunetv2 2.8.1's planners (default_experiment_planner.py, residual_encoder_unet_planners.py).
const std::vector<Preset>& presets() {
  static const std::vector<Preset> p = {
      {"default", "ExperimentPlanner", "nnUNetPlans", 8.0, NnunetConstants{}},
      {"resenc-m", "nnUNetPlannerResEncM", "nnUNetResEncUNetMPlans", 8.0,
       res_enc(680000000.0, 135000000.0, 8.0)},
      {"resenc-l", "nnUNetPlannerResEncL", "nnUNetResEncUNetLPlans", 24.0,
       res_enc(2100000000.0, 380000000.0, 24.0)},
      {"resenc-xl", "nnUNetPlannerResEncXL", "nnUNetResEncUNetXLPlans", 40.0,
       res_enc(3600000000.0, 560000000.0, 40.0)},
  };
  return p;
}

const Preset* find_preset(const std::string& name) {
  for (const auto& p : presets())
    if (name == p.name) return &p;
  return nullptr;
}

}  // namespace

const NnunetConstants* preset_constants(const std::string& preset) {
  const Preset* p = find_preset(preset);
  return p ? &p->constants : nullptr;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> out;
  for (const auto& p : presets()) out.emplace_back(p.name);
  return out;
}

std::string preset_error(const std::string& preset) {
  if (find_preset(preset)) return "";
  std::string known;
  for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  return "expected one of " + known + ", got '" + preset + "'";
}

double preset_memory_gb(const std::string& preset) {
  const Preset* p = find_preset(preset);
  return p ? p->memory_gb : 8.0;
}

std::pair<std::string, std::string> preset_nnunet_names(const std::string& preset) {
  const Preset* p = find_preset(preset);
  return p ? std::pair<std::string, std::string>{p->planner, p->plans}
           : std::pair<std::string, std::string>{"ExperimentPlanner", "nnUNetPlans"};
}

std::vector<double> fullres_target_spacing(const std::vector<std::vector<double>>& spacings,
                                           const std::vector<std::vector<double>>& shapes, double threshold) {
  const std::size_t dim = spacings.front().size();
  std::vector<double> target(dim), target_size(dim);
  for (std::size_t a = 0; a < dim; ++a) {
    std::vector<double> s, z;
    for (const auto& v : spacings) s.push_back(v[a]);
    for (const auto& v : shapes) z.push_back(v[a]);
    target[a] = np_percentile(s, 50);
    target_size[a] = np_percentile(z, 50);
  }
  const auto worst =
      static_cast<std::size_t>(std::max_element(target.begin(), target.end()) - target.begin());
  double other_sp = -INFINITY, other_size = INFINITY;
  for (std::size_t a = 0; a < dim; ++a)
    if (a != worst) {
      other_sp = std::max(other_sp, target[a]);
      other_size = std::min(other_size, target_size[a]);
    }
  const bool aniso_spacing = target[worst] > threshold * other_sp;
  const bool aniso_voxels = target_size[worst] * threshold < other_size;
  if (aniso_spacing && aniso_voxels) {
    std::vector<double> s;
    for (const auto& v : spacings) s.push_back(v[worst]);
    double t = np_percentile(s, 10);
    if (t < other_sp) t = std::max(other_sp, t) + 1e-5;
    target[worst] = t;
  }
  return target;
}

std::vector<int> transpose_forward(const std::vector<double>& target) {
  const int worst = static_cast<int>(std::max_element(target.begin(), target.end()) - target.begin());
  std::vector<int> f{worst};
  for (int a = 0; a < static_cast<int>(target.size()); ++a)
    if (a != worst) f.push_back(a);
  return f;
}

std::vector<int> transpose_backward(const std::vector<int>& forward) {
  std::vector<int> b(forward.size());
  for (std::size_t i = 0; i < forward.size(); ++i)
    b[static_cast<std::size_t>(forward[i])] = static_cast<int>(i);
  return b;
}

std::vector<double> compute_new_shape(const std::vector<double>& shape,
                                      const std::vector<double>& old_spacing,
                                      const std::vector<double>& new_spacing) {
  std::vector<double> out;
  for (std::size_t i = 0; i < shape.size(); ++i)
    out.push_back(py_round(old_spacing[i] / new_spacing[i] * shape[i]));
  return out;
}

std::vector<double> initial_patch_size(const std::vector<double>& spacing,
                                       const std::vector<double>& median_shape) {
  const std::size_t dim = spacing.size();
  std::vector<double> tmp;
  double prod = 1;
  for (double s : spacing) {
    tmp.push_back(1.0 / s);
    prod *= 1.0 / s;
  }
  const double scale =
      dim == 3 ? std::pow(256.0 * 256.0 * 256.0 / prod, 1.0 / 3.0) : std::pow(2048.0 * 2048.0 / prod, 0.5);
  std::vector<double> out;
  for (std::size_t i = 0; i < dim; ++i) out.push_back(std::min(py_round(tmp[i] * scale), median_shape[i]));
  return out;
}

namespace {

/// argsort(patch / median)[-1]: the axis with the largest ratio, the last of equal ones
/// (numpy sorts three values stably).
std::size_t axis_to_reduce(const std::vector<std::int64_t>& patch, const std::vector<double>& median) {
  std::size_t best = 0;
  double best_r = -INFINITY;
  for (std::size_t i = 0; i < patch.size(); ++i) {
    const double r = static_cast<double>(patch[i]) / median[i];
    if (r >= best_r) {
      best_r = r;
      best = i;
    }
  }
  return best;
}

std::vector<double> as_double(const std::vector<std::int64_t>& v) { return {v.begin(), v.end()}; }

}  // namespace

std::vector<Topology> shrink_sequence(const std::vector<double>& spacing,
                                      const std::vector<double>& median_shape, std::int64_t min_fm,
                                      std::size_t limit, std::int64_t min_stages) {
  std::vector<Topology> out{pool_and_conv_props(spacing, initial_patch_size(spacing, median_shape), min_fm)};
  while (out.size() < limit) {
    const Topology& cur = out.back();
    std::vector<std::int64_t> patch = cur.patch_size;
    const std::size_t axis = axis_to_reduce(patch, median_shape);
    std::vector<std::int64_t> tmp = patch;
    tmp[axis] -= cur.must_be_divisible_by[axis];
    if (tmp[axis] <= 0) break;
    const Topology probe = pool_and_conv_props(spacing, as_double(tmp), min_fm);
    patch[axis] -= probe.must_be_divisible_by[axis];
    if (patch[axis] <= 0) break;
    Topology next = pool_and_conv_props(spacing, as_double(patch), min_fm);
    if (next.n_stages() < min_stages) break;
    out.push_back(std::move(next));
  }
  return out;
}

}  // namespace segflow::models::planning
