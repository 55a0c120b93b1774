#pragma once
// Format dispatch: one entry point that reads (or writes) any image or label file of the
// format table (image_formats.hpp).

#include <filesystem>
#include <string>

#include "messages/status.hpp"
#include "pipeline/io/image.hpp"
#include "pipeline/io/image_formats.hpp"

namespace segflow::pipeline {

/// Detects the format: a folder is a DICOM series; a file by its name's ending, else by its
/// content (a DICOM file: no extension, or the DICM preamble).
ImageFormat detect_format(const std::filesystem::path& path);

/// Reads a file or folder of any format of the table (NIfTI, NRRD, MetaImage, npy, a DICOM
/// file or a folder with one DICOM image series). Errors name the file; a missing path is
/// not_found; a name no format claims is unsupported, listing the known endings.
Result<Image> read_image(const std::filesystem::path& path);

/// Writes `image` in the format its name ends like (NIfTI, NRRD, MetaImage; the formats
/// with a writer in the table). Others are unsupported.
Status write_image(const std::filesystem::path& path, const Image& image);

/// True for a volume file with geometry by its name (the table's has_geometry formats:
/// .nii, .nii.gz, .nrrd, .nhdr, .mha, .mhd).
bool is_volume_path(const std::filesystem::path& path);

}  // namespace segflow::pipeline
