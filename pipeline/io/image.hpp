#pragma once
// An image as every reader returns it: voxels as a tensor (C, Z, Y, X) plus geometry.

#include <ATen/core/Tensor.h>

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

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

/// segflow's name of a voxel type, as inspect prints it and the disk cache and tensor
/// archives store it: "uint8", "int16", "uint16", "float32", "bfloat16", "bool", ...; nullptr
/// for a type without one (complex, quantized, ...).
const char* dtype_name(at::ScalarType type);
/// The voxel type named by `name` (one of dtype_name's); nullopt for any other text.
std::optional<at::ScalarType> dtype_from_name(std::string_view name);
/// dtype_name of the tensor's type, or LibTorch's own name for a type without one.
std::string dtype_name(const at::Tensor& t);

}  // namespace segflow::pipeline
