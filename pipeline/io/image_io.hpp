#pragma once
// Format dispatch: one entry point that reads any supported image or label file.

#include <filesystem>
#include <string>

#include "messages/status.hpp"
#include "pipeline/io/image.hpp"

namespace segflow::pipeline {

enum class ImageFormat { nifti, npy, dicom_file, dicom_folder, unknown };

/// Detects the format from the name and, for DICOM, the content.
ImageFormat detect_format(const std::filesystem::path& path);
/// "nifti", "npy", "dicom", ...
const char* to_string(ImageFormat f);

/// Reads a NIfTI file, an npy file, a DICOM file or a folder with one DICOM image series.
/// Errors name the file; a missing path is not_found.
Result<Image> read_image(const std::filesystem::path& path);

}  // namespace segflow::pipeline
