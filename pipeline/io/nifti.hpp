#pragma once
// NIfTI-1 and NIfTI-2 (.nii, .nii.gz) reader and writer. Geometry from sform (preferred
// when sform_code > 0) or qform, converted from NIfTI's RAS to LPS.

#include <filesystem>

#include "messages/status.hpp"
#include "pipeline/io/image.hpp"

namespace segflow::pipeline {

/// Reads a NIfTI file. 3D volumes give (1, Z, Y, X); a 4th dimension becomes channels.
/// scl_slope/scl_inter (slope != 0 and not (1, 0)) give float32; otherwise the stored type.
/// Errors name the file and the header field (e.g. "dim[1]: expected > 0, got -3").
Result<Image> read_nifti(const std::filesystem::path& path);

/// Writes `image` as NIfTI-1 (.nii or .nii.gz by extension), sform and qform both set
/// (code 1, scanner), stored in the tensor's dtype. Written to a temp file and renamed.
Status write_nifti(const std::filesystem::path& path, const Image& image);

/// True for names the format table gives NIfTI (.nii, .nii.gz).
bool is_nifti_path(const std::filesystem::path& path);

}  // namespace segflow::pipeline
