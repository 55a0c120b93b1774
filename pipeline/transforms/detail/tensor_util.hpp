#pragma once
// Private helpers of the transforms: shape checks, axis conventions, geometry bookkeeping
// for flips/permutations/crops, torch generators from an Rng. Not part of the public API.
//
// Axis conventions: options name spatial axes in (x, y, z) order (DESIGN.md); tensors are
// (C, Z, Y, X) or (C, Y, X). For a tensor with `nsp` spatial dims, axis a (0 = x) is tensor
// dim nsp - a, and geometry axis a.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "messages/sample.hpp"
#include "messages/status.hpp"
#include "pipeline/stage.hpp"

namespace segflow::pipeline::detail {

/// "(1, 96, 96, 96)".
std::string shape_string(const at::Tensor& t);

/// Number of spatial dims of a (C, ...) tensor: 2 or 3; 0 when the shape is neither.
std::int64_t spatial_dims(const at::Tensor& t);

/// Tensor dim of spatial axis `axis` (0 = x) for a tensor with `nsp` spatial dims.
inline std::int64_t tensor_dim(int axis, std::int64_t nsp) { return nsp - axis; }

/// Spatial sizes in (x, y, z) order (z = 1 for 2D).
Size3 spatial_size_xyz(const at::Tensor& t);

/// Checks that every key exists and that they share spatial size and dimensionality.
/// Returns the spatial dims (2 or 3). Errors: "<stage>: sample 'id' has no 'label'", ...
Result<std::int64_t> check_keys(const Sample& s, const std::vector<std::string>& keys,
                                const std::string& stage, bool require_3d = false);

/// `keys` without those `s` lacks when `allow_missing`; `keys` itself otherwise (so that
/// check_keys reports the missing one).
std::vector<std::string> present_keys(const Sample& s, const std::vector<std::string>& keys,
                                      bool allow_missing);

/// True for floating tensors (intensity stages need them).
bool is_floating(const at::Tensor& t);

/// Removes the crop centre sets of fg_bg_indices (is_crop_index_key: fg_indices, bg_indices,
/// fg_indices_<v>) and their compact markers (stale after a spatial change).
void drop_indices(Sample& s);

/// Geometry of the grid after flipping axis `axis` (x = 0) of a grid of size `size` (xyz).
Geometry flip_geometry(const Geometry& g, const Size3& size, int axis);
/// Geometry after swapping axes a and b (x = 0). Size is swapped by the caller.
Geometry swap_geometry(const Geometry& g, int a, int b);
/// Geometry of a sub-grid starting at index `start` (xyz, may be negative for padding).
Geometry crop_geometry(const Geometry& g, const std::array<std::int64_t, 3>& start);

/// A torch generator on `device`, seeded with one draw from `rng`.
at::Generator make_generator(Rng& rng, const c10::Device& device);

/// Nearest-neighbour resize of the spatial dims of a (C, ...) tensor to `out` (tensor order),
/// pixel-centre aligned ("nearest-exact"), dtype preserved (works for integer labels).
at::Tensor resize_nearest(const at::Tensor& t, const std::vector<std::int64_t>& out);

/// Linear resize (bilinear or trilinear) of a (C, ...) tensor to `out` (tensor order),
/// align_corners = false; computed in float32 (or the tensor's floating type), cast back.
at::Tensor resize_linear(const at::Tensor& t, const std::vector<std::int64_t>& out);

}  // namespace segflow::pipeline::detail
