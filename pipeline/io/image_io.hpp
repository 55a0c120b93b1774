#pragma once
// Format dispatch: one entry point that reads any supported image or label file.

#include <filesystem>
#include <string>

#include "messages/status.hpp"
#include "pipeline/io/image.hpp"

namespace segflow::pipeline {

enum class ImageFormat { nifti, nrrd, metaimage, npy, dicom_file, dicom_folder, unknown };

/// Detects the format from the name and, for DICOM, the content.
ImageFormat detect_format(const std::filesystem::path& path);
/// "nifti", "nrrd", "metaimage", "npy", "dicom", ...
const char* to_string(ImageFormat f);

/// Reads a NIfTI, NRRD (.nrrd, .nhdr), MetaImage (.mha, .mhd) or npy file, a DICOM file or a
/// folder with one DICOM image series. Errors name the file; a missing path is not_found.
Result<Image> read_image(const std::filesystem::path& path);

/// True for a volume file with geometry by its name: .nii, .nii.gz, .nrrd, .nhdr, .mha, .mhd.
bool is_volume_path(const std::filesystem::path& path);

/// The file name without its image extension (.nii.gz, .nii, .nrrd, .nhdr, .mha, .mhd, .npy):
/// "case_001_0000.nii.gz" -> "case_001_0000".
std::string image_stem(const std::filesystem::path& path);

}  // namespace segflow::pipeline
