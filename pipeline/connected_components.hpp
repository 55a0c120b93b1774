#pragma once
// Connected components of a binary mask, 2D (Y, X) or 3D (Z, Y, X), and the two clean-ups
// nnU-Net's postprocessing is made of: keep the largest component, remove small ones.
//
// Algorithm: runs of foreground along X are the unit (a row of a 512^3 organ mask has a few
// runs, not 512 voxels); pass 1 finds every row's runs and joins, with a union-find over run
// indices, each run to the runs of the earlier neighbouring rows it touches (overlapping
// extents, widened by one voxel where the connectivity has diagonals); pass 2 numbers the
// roots in raster order of their first voxel (scipy.ndimage.label's order) and paints the
// label volume. No tensor operation per voxel. Single-threaded; reentrant.
//
// Connectivity, as scipy's generate_binary_structure(rank, k): 3D 6 (faces, k=1), 18 (faces
// and edges, k=2), 26 (all, k=3); 2D 4 (k=1) and 8 (k=2).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "messages/status.hpp"

namespace segflow::pipeline {

/// The components of one mask.
struct Components {
  at::Tensor labels;                ///< int32, the mask's shape: 0 background, 1..count()
  std::vector<std::int64_t> sizes;  ///< voxels of component i + 1 at [i]
  std::int64_t count() const { return static_cast<std::int64_t>(sizes.size()); }
};

/// The connectivity that joins every touching voxel: 26 for 3D, 8 for 2D.
int full_connectivity(std::int64_t dims);

/// Labels the non-zero voxels of `mask` ((Y, X) or (Z, Y, X), any integer or bool dtype, on
/// the CPU). Errors: another rank, a floating dtype, a connectivity not of the mask's rank
/// (expected 4|8 for 2D, 6|18|26 for 3D).
Result<Components> label_components(const at::Tensor& mask, int connectivity);

/// The largest component of `mask` (the first in raster order among equals) as a bool
/// tensor of its shape; all false for an empty mask. Errors as label_components.
Result<at::Tensor> keep_largest_component(const at::Tensor& mask, int connectivity);

/// `mask` without its components of fewer than `min_voxels` voxels, as a bool tensor.
/// Errors as label_components, or min_voxels < 0.
Result<at::Tensor> remove_small_components(const at::Tensor& mask, std::int64_t min_voxels, int connectivity);

}  // namespace segflow::pipeline
