#include "pipeline/transforms/detail/tensor_util.hpp"

#include "pipeline/cache/compact.hpp"
#include "pipeline/options.hpp"
#include "pipeline/transforms/crop.hpp"

#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include <iterator>

namespace segflow::pipeline::detail {

std::string shape_string(const at::Tensor& t) {
  std::string s = "(";
  for (std::int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  if (t.dim() == 1) s += ",";
  return s + ")";
}

std::int64_t spatial_dims(const at::Tensor& t) {
  if (!t.defined()) return 0;
  if (t.dim() == 4) return 3;
  if (t.dim() == 3) return 2;
  return 0;
}

Size3 spatial_size_xyz(const at::Tensor& t) {
  const std::int64_t nsp = spatial_dims(t);
  Size3 s{1, 1, 1};
  for (int a = 0; a < nsp; ++a) s[a] = t.size(tensor_dim(a, nsp));
  return s;
}

Result<std::int64_t> check_keys(const Sample& s, const std::vector<std::string>& keys,
                                const std::string& stage, bool require_3d) {
  std::int64_t nsp = 0;
  std::vector<std::int64_t> first_shape;
  std::string first_key;
  for (const auto& k : keys) {
    if (!s.has(k)) {
      std::vector<std::string> have;
      for (const auto& [name, t] : s.tensors) have.push_back(name);
      return invalid_argument(stage + ": sample '" + s.id + "' has no '" + k +
                              "' (it has: " + (have.empty() ? std::string("nothing") : join(have)) + ")");
    }
    const at::Tensor& t = s.at(k);
    const std::int64_t d = spatial_dims(t);
    if (d == 0 || (require_3d && d != 3))
      return invalid_argument(stage + ": sample '" + s.id + "': '" + k + "' must be " +
                              (require_3d ? "(C, Z, Y, X)" : "(C, Z, Y, X) or (C, Y, X)") + ", got " +
                              (t.defined() ? shape_string(t) : std::string("an undefined tensor")));
    std::vector<std::int64_t> sp(t.sizes().begin() + 1, t.sizes().end());
    if (first_key.empty()) {
      first_key = k;
      first_shape = sp;
      nsp = d;
    } else if (sp != first_shape) {
      return invalid_argument(stage + ": sample '" + s.id + "': spatial shapes differ: '" + first_key +
                              "' is " + shape_string(s.at(first_key)) + ", '" + k + "' is " +
                              shape_string(t));
    }
  }
  return nsp;
}

std::vector<std::string> present_keys(const Sample& s, const std::vector<std::string>& keys,
                                      bool allow_missing) {
  if (!allow_missing) return keys;
  std::vector<std::string> out;
  for (const auto& k : keys)
    if (s.has(k)) out.push_back(k);
  return out;
}

bool is_floating(const at::Tensor& t) { return at::isFloatingType(t.scalar_type()); }

void drop_indices(Sample& s) {
  const std::string marker = kCompactMarkerPrefix;  // their compact markers (pipeline/cache/compact.hpp)
  for (auto it = s.tensors.begin(); it != s.tensors.end();) {
    const std::string& k = it->first;
    const bool is_marker = k.compare(0, marker.size(), marker) == 0;
    it = is_crop_index_key(is_marker ? k.substr(marker.size()) : k) ? s.tensors.erase(it) : std::next(it);
  }
}

Geometry flip_geometry(const Geometry& g, const Size3& size, int axis) {
  Geometry out = g;
  std::array<double, 3> idx{0, 0, 0};
  idx[axis] = static_cast<double>(size[axis] - 1);
  out.origin = index_to_physical(g, idx);
  for (int r = 0; r < 3; ++r) out.direction[r * 3 + axis] = -g.direction[r * 3 + axis];
  return out;
}

Geometry swap_geometry(const Geometry& g, int a, int b) {
  Geometry out = g;
  std::swap(out.spacing[a], out.spacing[b]);
  for (int r = 0; r < 3; ++r) std::swap(out.direction[r * 3 + a], out.direction[r * 3 + b]);
  return out;
}

Geometry crop_geometry(const Geometry& g, const std::array<std::int64_t, 3>& start) {
  Geometry out = g;
  out.origin = index_to_physical(
      g, {static_cast<double>(start[0]), static_cast<double>(start[1]), static_cast<double>(start[2])});
  return out;
}

at::Generator make_generator(Rng& rng, const c10::Device& device) {
  const std::uint64_t seed = rng.next_u64();
  if (device.is_cuda()) {
    at::Generator g = at::detail::getCUDAHooks().getNewGenerator(device.index());
    g.set_current_seed(seed);
    return g;
  }
  TORCH_CHECK(device.is_cpu(), "no random generator for device ", device.str());
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

at::Tensor resize_nearest(const at::Tensor& t, const std::vector<std::int64_t>& out) {
  at::Tensor r = t;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::int64_t dim = static_cast<std::int64_t>(i) + 1;
    const std::int64_t n = t.size(dim), m = out[i];
    if (n == m) continue;
    // Made where t is: no host-to-device copy (a blocking one from pageable memory).
    const auto opts = torch::TensorOptions(torch::kFloat64).device(t.device());
    auto idx = ((torch::arange(m, opts) + 0.5) * (static_cast<double>(n) / static_cast<double>(m)))
                   .floor()
                   .clamp(0, n - 1)
                   .to(torch::kLong);
    r = r.index_select(dim, idx);
  }
  return r;
}

at::Tensor resize_linear(const at::Tensor& t, const std::vector<std::int64_t>& out) {
  const auto dtype = t.scalar_type();
  const bool keep = dtype == torch::kFloat32 || dtype == torch::kFloat64;
  at::Tensor x = keep ? t : t.to(torch::kFloat32);
  namespace F = torch::nn::functional;
  auto opts = F::InterpolateFuncOptions().size(out).align_corners(false);
  opts = out.size() == 3 ? opts.mode(torch::kTrilinear) : opts.mode(torch::kBilinear);
  at::Tensor y = F::interpolate(x.unsqueeze(0), opts).squeeze(0);
  if (is_floating(t) && !keep) y = y.to(dtype);
  return y;
}

}  // namespace segflow::pipeline::detail
