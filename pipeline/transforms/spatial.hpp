#pragma once
// Spatial transforms: the tensor kernels (free functions) and the options of their stages.
//
// Conventions: tensors are (C, Z, Y, X) or (C, Y, X); options give per-axis values and
// axis numbers in (x, y, z) order (DESIGN.md), 0 = x. Integer tensors (labels) are always
// resampled with nearest neighbour, so their set of values never grows (padding adds 0).

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "messages/geometry.hpp"
#include "messages/status.hpp"
#include "pipeline/fwd.hpp"

namespace segflow::pipeline {

// ---------------------------------------------------------------- reorient (deterministic)

/// Options of stage "reorient".
struct ReorientOptions {
  std::vector<std::string> keys{"image", "label"};  ///< tensors to reorient (same grid)
  bool allow_missing_keys = false;                  ///< skip keys a sample lacks (e.g. no label at inference)
  std::string axcodes = "RAS";  ///< where axes x, y, z point: one of L/R, P/A, I/S each ("RAS", "LPS")
  void bind(OptionParser& p);
};

/// How to reorient a grid: new axis i is old axis `source[i]`, flipped when `flip[i]`.
struct ReorientPlan {
  std::array<int, 3> source{0, 1, 2};
  std::array<bool, 3> flip{false, false, false};
  bool identity() const { return source == std::array<int, 3>{0, 1, 2} && !flip[0] && !flip[1] && !flip[2]; }
};

/// Checks an orientation code ("RAS", "LPS", "LIP", ...).
Status check_axcodes(const std::string& axcodes);
/// The permutation and flips that bring `g` closest to `axcodes` (direction cosines are
/// matched to the nearest signed axis; oblique grids stay oblique).
ReorientPlan plan_reorient(const Geometry& g, const std::string& axcodes);
/// Applies a plan to a (C, Z, Y, X) tensor.
at::Tensor reorient_tensor(const at::Tensor& t, const ReorientPlan& plan);
/// Geometry after a plan, for a grid of `size` (x, y, z): same physical voxels.
Geometry reorient_geometry(const Geometry& g, const Size3& size, const ReorientPlan& plan);

// ---------------------------------------------------------------- resample (deterministic)

/// Options of stage "resample".
struct ResampleOptions {
  std::vector<std::string> keys{"image", "label"};  ///< tensors to resample (same grid)
  bool allow_missing_keys = false;                  ///< skip keys a sample lacks (e.g. no label at inference)
  std::array<double, 3> spacing{1.5, 1.5, 2.0};     ///< target spacing (x, y, z), mm, > 0
  std::string mode = "trilinear";                   ///< floating tensors: trilinear | nearest
  std::string grid = "keep_extent";                 ///< keep_extent | exact_spacing (MONAI's Spacingd)
  void bind(OptionParser& p);
};

/// Size (x, y, z) after resampling: round(size * spacing / target), at least 1.
Size3 resampled_size(const Size3& size, const std::array<double, 3>& spacing,
                     const std::array<double, 3>& target);
/// Resamples a (C, Z, Y, X) tensor to `size` (x, y, z), voxel-centre aligned (the field of
/// view is kept): trilinear for floating tensors when `linear`, nearest otherwise.
at::Tensor resample_tensor(const at::Tensor& t, const Size3& size, bool linear);
/// Geometry after resampling a grid of `from` voxels to `to`: spacing * from / to (equal to
/// the target spacing when it divides the field of view), origin moved by half a voxel
/// difference so the field of view is kept.
Geometry resample_geometry(const Geometry& g, const Size3& from, const Size3& to);

/// `grid: exact_spacing` (MONAI's Spacingd): size (x, y, z) round((size - 1) * spacing /
/// target) + 1, at least 1.
Size3 exact_spacing_size(const Size3& size, const std::array<double, 3>& spacing,
                         const std::array<double, 3>& target);
/// Resamples a (C, Z, Y, X) tensor onto the grid whose voxel i lies at old continuous index
/// i * target / spacing on each axis (the first voxel centre kept), `size` (x, y, z) voxels;
/// positions past the last old voxel take its value. Linear per axis (trilinear) for floating
/// tensors when `linear`, nearest (half to even) otherwise.
at::Tensor resample_tensor_exact(const at::Tensor& t, const Size3& size, const std::array<double, 3>& spacing,
                                 const std::array<double, 3>& target, bool linear);

/// Resamples an integer label map or float maps (C, Z, Y, X) from grid `src` onto the grid
/// `dst` of size `dst_size` through patient coordinates (nearest for integer types, linear
/// otherwise); points outside `src` get 0.
at::Tensor resample_to_grid(const at::Tensor& data, const Geometry& src, const Geometry& dst,
                            const Size3& dst_size);

// ---------------------------------------------------------- crop_foreground (deterministic)

/// Options of stage "crop_foreground".
struct CropForegroundOptions {
  std::vector<std::string> keys{"image", "label"};  ///< tensors to crop (same grid)
  bool allow_missing_keys = false;                  ///< skip keys a sample lacks (e.g. no label at inference)
  std::string source_key = "image";                 ///< tensor whose foreground is kept
  double threshold = 0.0;  ///< foreground: source > threshold (any channel), source units
  std::array<std::int64_t, 3> margin{0, 0, 0};  ///< voxels added on each side (x, y, z), >= 0
  void bind(OptionParser& p);
};

/// Bounding box [start, end) per spatial axis in (x, y, z) order.
struct Box3 {
  std::array<std::int64_t, 3> start{0, 0, 0};
  std::array<std::int64_t, 3> end{0, 0, 0};
  bool empty = true;
};
/// Bounding box of `mask` (C, ...) any channel, grown by `margin` and clipped to the grid.
Box3 foreground_box(const at::Tensor& mask, const std::array<std::int64_t, 3>& margin);
/// Crops the spatial dims of a (C, ...) tensor to `box`.
at::Tensor crop_tensor(const at::Tensor& t, const Box3& box);

// ------------------------------------------------------------------------ random, spatial

/// Options of stage "rand_flip".
struct RandFlipOptions {
  std::vector<std::string> keys{"image", "label"};  ///< tensors to flip together
  bool allow_missing_keys = false;                  ///< skip keys a sample lacks (e.g. no label at inference)
  double prob = 0.5;                                ///< chance of flipping each axis, [0, 1]
  std::vector<std::int64_t> spatial_axis{0, 1, 2};  ///< axes that may flip, 0 = x
  void bind(OptionParser& p);
};

/// Options of stage "rand_rotate90".
struct RandRotate90Options {
  std::vector<std::string> keys{"image", "label"};  ///< tensors to rotate together
  bool allow_missing_keys = false;                  ///< skip keys a sample lacks (e.g. no label at inference)
  double prob = 0.1;                                ///< chance of rotating, [0, 1]
  std::int64_t max_k = 3;                           ///< k quarter turns, k uniform in [1, max_k]
  std::vector<std::int64_t> spatial_axes{0, 1};     ///< the plane of rotation, 2 axes, 0 = x
  void bind(OptionParser& p);
};

/// Options of stage "rand_affine".
struct RandAffineOptions {
  std::vector<std::string> keys{"image", "label"};  ///< tensors to warp together
  bool allow_missing_keys = false;                  ///< skip keys a sample lacks (e.g. no label at inference)
  double prob = 0.1;                                ///< chance of warping, [0, 1]
  std::array<double, 3> rotate_range{0, 0, 0};      ///< angle about x, y, z uniform in [-r, r], radians
  std::array<double, 3> scale_range{0, 0, 0};       ///< zoom per axis 1 + uniform in [-s, s]
  std::array<double, 3> translate_range{0, 0, 0};   ///< shift per axis uniform in [-t, t], voxels
  std::string mode = "bilinear";                    ///< floating tensors: bilinear | nearest
  std::string padding_mode = "zeros";               ///< outside the input: zeros | border | reflection
  void bind(OptionParser& p);
};

/// Affine parameters in (x, y, z) order; identity by default.
struct AffineParams {
  std::array<double, 3> rotate{0, 0, 0};     ///< radians about x, y, z
  std::array<double, 3> scale{1, 1, 1};      ///< zoom per axis (> 1 magnifies)
  std::array<double, 3> translate{0, 0, 0};  ///< voxels
  bool identity() const;
};

/// Flips the spatial axes (x = 0) of a (C, ...) tensor.
at::Tensor flip_tensor(const at::Tensor& t, const std::vector<int>& axes);
/// Rotates by k quarter turns in the plane (a0, a1) (x = 0), from a0 towards a1.
at::Tensor rotate90_tensor(const at::Tensor& t, int k, int a0, int a1);
/// Warps a (C, ...) tensor by `params` about the grid centre (output voxel -> input voxel
/// is scale, then rotate, then translate), with affine_grid + grid_sample. Identity params
/// return the input unchanged (exact). `linear` applies to floating tensors; integer
/// tensors are always nearest. `padding_mode`: zeros | border | reflection.
at::Tensor affine_tensor(const at::Tensor& t, const AffineParams& params, bool linear,
                         const std::string& padding_mode);

/// Geometry of the grid that affine_tensor(t, params) produces from a grid `g` of `size`
/// (x, y, z) with `nsp` spatial dims, so that every output voxel keeps the physical place
/// of the input point it was sampled from. Rotation and zoom act in voxel space; with
/// isotropic in-plane spacing (or no rotation) the result is exact. Otherwise a voxel-space
/// rotation is a physical shear, which an orthonormal direction cannot hold: the direction
/// is then the nearest rotation (polar decomposition), the spacings are the column lengths,
/// and the grid centre stays exact.
Geometry affine_geometry(const Geometry& g, const Size3& size, std::int64_t nsp, const AffineParams& params);

}  // namespace segflow::pipeline
