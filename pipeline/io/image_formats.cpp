#include "pipeline/io/image_formats.hpp"

#include "pipeline/io/dicom.hpp"
#include "pipeline/io/metaimage.hpp"
#include "pipeline/io/nifti.hpp"
#include "pipeline/io/npy.hpp"
#include "pipeline/io/nrrd.hpp"

namespace segflow::pipeline {

namespace fs = std::filesystem;

namespace {

Result<Image> read_dicom_path(const fs::path& p) { return read_dicom(p); }
Status write_nrrd_path(const fs::path& p, const Image& image) { return write_nrrd(p, image); }
Status write_metaimage_path(const fs::path& p, const Image& image) { return write_metaimage(p, image); }

/// A file without an extension, or one with the DICM preamble, is DICOM.
bool dicom_by_content(const fs::path& p) { return p.extension().empty() || looks_like_dicom(p); }

bool name_ends_with(const std::string& name, const std::string& ending) {
  return name.size() > ending.size() && name.ends_with(ending);
}

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
  return s;
}

}  // namespace

const std::vector<ImageFormatInfo>& image_formats() {
  // clang-format off
  static const std::vector<ImageFormatInfo> formats = {
      {.format = ImageFormat::nifti, .name = "nifti", .title = "NIfTI",
       .extensions = {".nii.gz", ".nii"}, .has_geometry = true,
       .read = read_nifti, .write = write_nifti},
      {.format = ImageFormat::nrrd, .name = "nrrd", .title = "NRRD",
       .extensions = {".nrrd", ".nhdr"}, .upper_case_too = true, .has_geometry = true,
       .data_extensions = {".raw", ".raw.gz"}, .case_suffixes = {".seg.nrrd"},
       .read = read_nrrd, .write = write_nrrd_path},
      {.format = ImageFormat::metaimage, .name = "metaimage", .title = "MetaImage",
       .extensions = {".mha", ".mhd"}, .upper_case_too = true, .has_geometry = true,
       .data_extensions = {".raw", ".zraw"},
       .read = read_metaimage, .write = write_metaimage_path},
      {.format = ImageFormat::npy, .name = "npy", .title = "NumPy",
       .extensions = {".npy"},
       .read = read_npy_image},  // no geometry to write: write_npy takes a tensor
      {.format = ImageFormat::dicom_file, .name = "dicom", .title = "DICOM",
       .extensions = {".dcm", ".ima"}, .upper_case_too = true, .case_suffixes = {".seg.dcm"},
       .by_content = dicom_by_content,
       .read = read_dicom_path},  // series are written by write_dicom_series (a folder)
      {.format = ImageFormat::dicom_folder, .name = "dicom-folder", .title = "DICOM series",
       .folder = true,
       .read = read_dicom_path},
  };
  // clang-format on
  return formats;
}

const ImageFormatInfo* image_format_info(ImageFormat f) {
  for (const auto& info : image_formats())
    if (info.format == f) return &info;
  return nullptr;
}

const char* to_string(ImageFormat f) {
  const ImageFormatInfo* info = image_format_info(f);
  return info ? info->name : "unknown";
}

std::string format_ending(const fs::path& path) {
  const std::string name = path.filename().string();
  std::string best;
  for (const auto& info : image_formats())
    for (const auto& e : info.extensions)
      for (const std::string& spelling : {e, info.upper_case_too ? upper(e) : e})
        if (spelling.size() > best.size() && name_ends_with(name, spelling)) best = spelling;
  return best;
}

ImageFormat format_from_name(const fs::path& path) {
  const std::string ending = format_ending(path);
  if (ending.empty()) return ImageFormat::unknown;
  for (const auto& info : image_formats())
    for (const auto& e : info.extensions)
      if (ending == e || (info.upper_case_too && ending == upper(e))) return info.format;
  return ImageFormat::unknown;
}

}  // namespace segflow::pipeline
