#include "pipeline/io/image_io.hpp"

#include <torch/torch.h>

#include "pipeline/io/dicom.hpp"
#include "pipeline/io/nifti.hpp"
#include "pipeline/io/npy.hpp"

namespace segflow::pipeline {

namespace fs = std::filesystem;

ImageFormat detect_format(const fs::path& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return ImageFormat::dicom_folder;
  if (is_nifti_path(path)) return ImageFormat::nifti;
  if (path.extension() == ".npy") return ImageFormat::npy;
  auto ext = path.extension().string();
  if (ext == ".dcm" || ext == ".DCM" || ext == ".ima" || ext == ".IMA" || ext.empty() ||
      looks_like_dicom(path))
    return ImageFormat::dicom_file;
  return ImageFormat::unknown;
}

const char* to_string(ImageFormat f) {
  switch (f) {
    case ImageFormat::nifti:
      return "nifti";
    case ImageFormat::npy:
      return "npy";
    case ImageFormat::dicom_file:
      return "dicom";
    case ImageFormat::dicom_folder:
      return "dicom-folder";
    case ImageFormat::unknown:
      return "unknown";
  }
  return "unknown";
}

Result<Image> read_image(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return not_found(path.string() + ": no such file or folder");
  switch (detect_format(path)) {
    case ImageFormat::nifti:
      return read_nifti(path);
    case ImageFormat::npy:
      return read_npy_image(path);
    case ImageFormat::dicom_file:
    case ImageFormat::dicom_folder:
      return read_dicom(path);
    case ImageFormat::unknown:
      break;
  }
  return unsupported(path.string() +
                     ": unknown image format: expected .nii, .nii.gz, .npy, a DICOM file or a "
                     "folder with a DICOM series");
}

}  // namespace segflow::pipeline
