#pragma once
// Evaluation metrics of a predicted label map against a ground truth on the same grid
// (`segflow eval`): Dice, IoU, HD95, average symmetric surface distance, normalized surface
// Dice and volumes, spacing-aware, per label value. Plain functions on CPU tensors.
//
// Conventions (MONAI 1.4's compute_dice / compute_iou with ignore_empty=False,
// compute_hausdorff_distance, compute_average_surface_distance(symmetric=True) and
// compute_surface_dice without sub-voxels; tests/models/test_eval_metrics.cpp compares):
// - Surface of a mask: its voxels with at least one of the 6 face neighbours outside the
//   mask, the outside of the grid counting as outside (scipy's binary_erosion with the
//   cross-shaped structure and border_value 0, XOR the mask: what MONAI's get_mask_edges
//   does when no sub-voxel spacing is asked for). A one-voxel-thick shell, not a mesh.
// - Distances: from each surface voxel of one mask to the nearest surface voxel of the
//   other, in mm (voxel centres, anisotropic spacing), by an exact Euclidean distance
//   transform (Felzenszwalb & Huttenlocher's separable lower-envelope algorithm).
// - HD95: the larger of the two directed 95th percentiles (linear interpolation between
//   order statistics, as numpy/torch quantile). ASSD: the mean over both directed sets of
//   distances together. NSD at tolerance T: surface voxels of both masks within T mm of
//   the other surface, over all surface voxels of both.
// - Both masks empty: Dice 1, IoU 1, HD95 / ASSD / NSD NaN (nothing to measure; MONAI gives
//   the same). One mask empty: Dice 0, IoU 0, NSD 0, HD95 and ASSD +inf (MONAI: ASSD inf,
//   HD95 NaN, because torch.quantile of infinities is NaN).

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <vector>

#include "models/training/metrics.hpp"

namespace segflow::models {

/// Exact Euclidean distance transform: for every voxel of `features` ((Z, Y, X) or (Y, X),
/// any dtype, non-zero = feature) the distance in mm to the nearest feature voxel, with
/// `spacing` in tensor axis order ((z, y, x) or (y, x), mm, > 0). (Z, Y, X) float64 on the
/// CPU; +inf everywhere when there is no feature. Threads: LibTorch's intra-op pool.
at::Tensor euclidean_distance_transform(const at::Tensor& features, const std::vector<double>& spacing);

/// Surface voxels of a mask ((Z, Y, X) or (Y, X), non-zero = inside): uint8 (kByte) of the
/// same shape, 1 where a voxel is inside and a face neighbour is outside or off the grid.
at::Tensor surface_voxels(const at::Tensor& mask);

/// Scores of one class in one case. NaN and +inf as in the header comment.
struct ClassScores {
  std::int64_t label = 0;     ///< the label value scored
  double dice = 0;            ///< 2|P∩G| / (|P| + |G|)
  double iou = 0;             ///< |P∩G| / |P∪G|
  double hd95 = 0;            ///< mm
  double assd = 0;            ///< mm
  double nsd = 0;             ///< in [0, 1], at EvalMetricOptions::tolerance_mm
  double volume_pred_ml = 0;  ///< |P| × voxel volume, ml
  double volume_gt_ml = 0;    ///< |G| × voxel volume, ml
  std::int64_t voxels_pred = 0;
  std::int64_t voxels_gt = 0;
};

struct EvalMetricOptions {
  double tolerance_mm = 2.0;  ///< NSD tolerance, mm, >= 0
  double percentile = 95.0;   ///< Hausdorff percentile, [0, 100]
};

/// Scores `labels` of the integer label maps `pred` and `gt` ((Z, Y, X), (1, Z, Y, X) or
/// (Y, X); same shape, same grid) with voxel spacing `spacing_xyz` ((x, y, z) mm as in
/// Geometry; (x, y) for 2D). One entry per label, in the order given. Throws c10::Error on
/// shape mismatch or a non-positive spacing.
std::vector<ClassScores> score_label_maps(const at::Tensor& pred, const at::Tensor& gt,
                                          const std::vector<std::int64_t>& labels,
                                          const std::vector<double>& spacing_xyz,
                                          const EvalMetricOptions& options = {});

/// The `q`-th percentile (0..100) of `values` with linear interpolation between order
/// statistics (numpy's default, torch.quantile's). NaN for no values. Reorders `values`.
double percentile_linear(std::vector<double>& values, double q);

}  // namespace segflow::models
