#include "pipeline/connected_components.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

namespace segflow::pipeline {

namespace {

/// The runs of foreground along X of every row, and a union-find over them.
struct RunForest {
  std::vector<std::int32_t> start, end;  ///< x extent of run k: [start, end)
  std::vector<std::int64_t> row_begin;   ///< runs of row r: [row_begin[r], row_begin[r + 1])
  std::vector<std::uint32_t> parent;

  std::uint32_t find(std::uint32_t k) {
    while (parent[k] != k) {
      parent[k] = parent[parent[k]];  // path halving
      k = parent[k];
    }
    return k;
  }
  /// Joins two sets; the smaller run index (earlier in raster order) stays the root.
  void join(std::uint32_t a, std::uint32_t b) {
    a = find(a);
    b = find(b);
    if (a < b)
      parent[b] = a;
    else if (b < a)
      parent[a] = b;
  }
};

/// Appends the runs of one row of 0/1 bytes.
void find_runs(const std::uint8_t* p, std::int32_t nx, RunForest& f) {
  constexpr std::uint64_t kAllOnes = 0x0101010101010101ULL;
  std::int32_t i = 0;
  while (i < nx) {
    for (std::uint64_t w; i + 8 <= nx && (std::memcpy(&w, p + i, 8), w == 0);) i += 8;
    while (i < nx && p[i] == 0) ++i;
    if (i == nx) break;
    const std::int32_t s = i;
    for (std::uint64_t w; i + 8 <= nx && (std::memcpy(&w, p + i, 8), w == kAllOnes);) i += 8;
    while (i < nx && p[i] != 0) ++i;
    f.start.push_back(s);
    f.end.push_back(i);
    f.parent.push_back(static_cast<std::uint32_t>(f.parent.size()));
  }
}

/// Joins the runs of row `r` to those of an earlier row `n` that they touch; `widen` is 1
/// where the neighbour offset allows a diagonal step along X, else 0.
void join_rows(RunForest& f, std::int64_t r, std::int64_t n, std::int32_t widen) {
  std::int64_t i = f.row_begin[r], j = f.row_begin[n];
  const std::int64_t ie = f.row_begin[r + 1], je = f.row_begin[n + 1];
  while (i < ie && j < je) {
    if (f.start[j] < f.end[i] + widen && f.start[i] < f.end[j] + widen)
      f.join(static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(j));
    if (f.end[i] < f.end[j])
      ++i;
    else
      ++j;
  }
}

struct Dims {
  std::int64_t z = 1, y = 1, x = 1;
};

/// Pass 1: the runs of every row, joined to their earlier neighbours.
void build_forest(const std::uint8_t* p, const Dims& d, int connectivity, bool three_d, RunForest& f) {
  // X widening of the in-plane neighbour row (z, y-1) and the face row (z-1, y); of the edge
  // rows (z-1, y±1) (-1: not neighbours).
  const std::int32_t w_face = (connectivity == 6 || connectivity == 4) ? 0 : 1;
  const std::int32_t w_edge = connectivity == 26 ? 1 : connectivity == 18 ? 0 : -1;
  f.row_begin.assign(static_cast<std::size_t>(d.z * d.y + 1), 0);
  for (std::int64_t z = 0; z < d.z; ++z) {
    for (std::int64_t y = 0; y < d.y; ++y) {
      const std::int64_t r = z * d.y + y;
      find_runs(p + r * d.x, static_cast<std::int32_t>(d.x), f);
      f.row_begin[r + 1] = static_cast<std::int64_t>(f.start.size());
      if (f.row_begin[r + 1] == f.row_begin[r]) continue;
      if (y > 0) join_rows(f, r, r - 1, w_face);
      if (!three_d || z == 0) continue;
      join_rows(f, r, r - d.y, w_face);
      if (w_edge < 0) continue;
      if (y > 0) join_rows(f, r, r - d.y - 1, w_edge);
      if (y + 1 < d.y) join_rows(f, r, r - d.y + 1, w_edge);
    }
  }
}

/// Pass 2: labels in raster order of each set's first run, sizes, and the painted volume.
Components paint(RunForest& f, const Dims& d, at::IntArrayRef shape) {
  Components c;
  const std::size_t n = f.start.size();
  std::vector<std::int32_t> run_label(n);
  for (std::size_t k = 0; k < n; ++k) {
    const std::uint32_t root = f.find(static_cast<std::uint32_t>(k));
    if (root == k) {
      c.sizes.push_back(0);
      run_label[k] = static_cast<std::int32_t>(c.sizes.size());
    } else {
      run_label[k] = run_label[root];
    }
    c.sizes[static_cast<std::size_t>(run_label[k] - 1)] += f.end[k] - f.start[k];
  }
  c.labels = at::zeros(shape, at::kInt);
  std::int32_t* out = c.labels.data_ptr<std::int32_t>();
  for (std::int64_t r = 0; r < d.z * d.y; ++r) {
    std::int32_t* row = out + r * d.x;
    for (std::int64_t k = f.row_begin[r]; k < f.row_begin[r + 1]; ++k)
      std::fill(row + f.start[k], row + f.end[k], run_label[k]);
  }
  return c;
}

Status check_mask(const at::Tensor& mask, int connectivity) {
  if (!mask.defined() || (mask.dim() != 2 && mask.dim() != 3))
    return invalid_argument(
        "connected components: mask: expected a (Y, X) or (Z, Y, X) tensor, got " +
        std::string(mask.defined() ? std::to_string(mask.dim()) + " dimensions" : "none"));
  if (c10::isFloatingType(mask.scalar_type()) || c10::isComplexType(mask.scalar_type()))
    return invalid_argument("connected components: mask: expected a bool or integer dtype, got " +
                            std::string(c10::toString(mask.scalar_type())));
  const bool ok = mask.dim() == 3 ? (connectivity == 6 || connectivity == 18 || connectivity == 26)
                                  : (connectivity == 4 || connectivity == 8);
  if (!ok)
    return invalid_argument("connected components: connectivity: expected " +
                            std::string(mask.dim() == 3 ? "6, 18 or 26" : "4 or 8") + " for a " +
                            std::to_string(mask.dim()) + "D mask, got " + std::to_string(connectivity));
  if (mask.numel() >= std::numeric_limits<std::int32_t>::max() ||
      mask.size(-1) >= std::numeric_limits<std::int32_t>::max())
    return invalid_argument("connected components: mask: expected fewer than 2^31 voxels, got " +
                            std::to_string(mask.numel()));
  return Status::ok();
}

}  // namespace

int full_connectivity(std::int64_t dims) { return dims == 2 ? 8 : 26; }

Result<Components> label_components(const at::Tensor& mask, int connectivity) {
  if (Status st = check_mask(mask, connectivity); !st.is_ok()) return st;
  at::Tensor bytes = (mask.scalar_type() == at::kBool ? mask : mask.ne(0)).cpu().contiguous();
  const bool three_d = mask.dim() == 3;
  Dims d;
  if (three_d) d.z = mask.size(0);
  d.y = mask.size(-2);
  d.x = mask.size(-1);
  RunForest f;
  build_forest(reinterpret_cast<const std::uint8_t*>(bytes.data_ptr<bool>()), d, connectivity, three_d, f);
  return paint(f, d, mask.sizes());
}

Result<at::Tensor> keep_largest_component(const at::Tensor& mask, int connectivity) {
  auto c = label_components(mask, connectivity);
  if (!c.is_ok()) return c.status();
  if (c->count() == 0) return at::zeros(mask.sizes(), at::kBool);
  const auto best = std::max_element(c->sizes.begin(), c->sizes.end()) - c->sizes.begin();
  return c->labels.eq(static_cast<std::int32_t>(best + 1));
}

Result<at::Tensor> remove_small_components(const at::Tensor& mask, std::int64_t min_voxels,
                                           int connectivity) {
  if (min_voxels < 0)
    return invalid_argument("remove small components: min_voxels: expected >= 0, got " +
                            std::to_string(min_voxels));
  auto c = label_components(mask, connectivity);
  if (!c.is_ok()) return c.status();
  std::vector<std::uint8_t> keep(c->sizes.size() + 1, 0);
  for (std::size_t i = 0; i < c->sizes.size(); ++i) keep[i + 1] = c->sizes[i] >= min_voxels ? 1 : 0;
  at::Tensor out = at::empty(mask.sizes(), at::kBool);
  const std::int32_t* l = c->labels.data_ptr<std::int32_t>();
  auto* o = reinterpret_cast<std::uint8_t*>(out.data_ptr<bool>());
  for (std::int64_t i = 0; i < out.numel(); ++i) o[i] = keep[static_cast<std::size_t>(l[i])];
  return out;
}

}  // namespace segflow::pipeline
