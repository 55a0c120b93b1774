#pragma once
// The image formats segflow reads, as one table (image_formats.cpp): each entry has its names,
// the file name endings it is known by, and its reader (and writer where there is one).
// Format detection and dispatch (image_io.hpp), dataset scanning (dataset.hpp) and case
// naming (case_files.hpp) all read the table, so adding a format is its reader file in this
// folder, its value in ImageFormat below and one entry in image_formats.cpp.

#include <filesystem>
#include <string>
#include <vector>

#include "messages/status.hpp"
#include "pipeline/io/image.hpp"

namespace segflow::pipeline {

/// The formats of the table, and `unknown` for a file none of them claims.
enum class ImageFormat { nifti, nrrd, metaimage, npy, dicom_file, dicom_folder, unknown };
/// The entry's name: "nifti", "nrrd", "metaimage", "npy", "dicom", "dicom-folder"; "unknown".
const char* to_string(ImageFormat f);

/// One image format.
struct ImageFormatInfo {
  ImageFormat format = ImageFormat::unknown;
  const char* name = "";   ///< to_string(format), what `segflow inspect` prints as "format"
  const char* title = "";  ///< in messages: "NIfTI", "DICOM"
  /// File name endings, lower case, the usual one first (".nii.gz" before ".nii"): how the
  /// format is recognised by name, and the order labels are looked up in (scan_dataset).
  std::vector<std::string> extensions;
  bool upper_case_too = false;  ///< the endings in capitals (".NRRD") name this format too
  /// A volume with geometry: an MSD / nnU-Net image or label, a label beside a DICOM series.
  bool has_geometry = false;
  /// Data files a detached header names (".raw" beside ".nhdr"): read through their header,
  /// never a case of their own.
  std::vector<std::string> data_extensions;
  /// Longer endings that case names drop too (3D Slicer's ".seg.nrrd", ".seg.dcm").
  std::vector<std::string> case_suffixes;
  /// For a file whose name no entry claims: true when the content is this format (DICOM).
  bool (*by_content)(const std::filesystem::path&) = nullptr;
  bool folder = false;  ///< read from a folder (a DICOM series)
  Result<Image> (*read)(const std::filesystem::path&) = nullptr;
  /// Writes `image` in this format; nullptr where segflow writes no such file.
  Status (*write)(const std::filesystem::path&, const Image&) = nullptr;
};

/// Every format, in the order detection tries them.
const std::vector<ImageFormatInfo>& image_formats();
/// The entry of `f` (nullptr for unknown).
const ImageFormatInfo* image_format_info(ImageFormat f);

/// The format the file name of `path` ends like (longest ending; the name must be longer
/// than it), without touching the file: "ct.nii.gz" -> nifti. unknown when none.
ImageFormat format_from_name(const std::filesystem::path& path);
/// The ending of the file name of `path` that names its format (".nii.gz"); "" when none.
std::string format_ending(const std::filesystem::path& path);

}  // namespace segflow::pipeline
