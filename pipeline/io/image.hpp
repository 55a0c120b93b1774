#pragma once
// An image as every reader returns it: voxels as a tensor (C, Z, Y, X) plus geometry.

#include <ATen/core/Tensor.h>

#include <filesystem>
#include <string>

#include "messages/geometry.hpp"

namespace segflow::pipeline {

/// A decoded volume. `voxels` is (C, Z, Y, X), contiguous, on the CPU. Intensities are
/// float32 after any rescale (DICOM RescaleSlope/Intercept, NIfTI scl_slope/inter);
/// otherwise the file's own type (label maps keep their integer type).
struct Image {
  at::Tensor voxels;             ///< (C, Z, Y, X)
  Geometry geometry;             ///< LPS, (x, y, z)
  std::filesystem::path source;  ///< file or folder it was read from
  std::string modality;          ///< "CT", "MR", "SEG", ... when the format says; else empty

  /// Size in (x, y, z) order.
  Size3 size() const;
  /// Number of channels (C).
  std::int64_t channels() const;
};

/// Name of a tensor dtype as inspect prints it: "uint8", "int16", "float32", ...
std::string dtype_name(const at::Tensor& t);

}  // namespace segflow::pipeline
