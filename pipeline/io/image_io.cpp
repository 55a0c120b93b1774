#include "pipeline/io/image_io.hpp"

#include <torch/torch.h>

#include "pipeline/io/dicom.hpp"
#include "pipeline/io/metaimage.hpp"
#include "pipeline/io/nifti.hpp"
#include "pipeline/io/npy.hpp"
#include "pipeline/io/nrrd.hpp"

namespace segflow::pipeline {

namespace fs = std::filesystem;

ImageFormat detect_format(const fs::path& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return ImageFormat::dicom_folder;
  if (is_nifti_path(path)) return ImageFormat::nifti;
  if (is_nrrd_path(path)) return ImageFormat::nrrd;
  if (is_metaimage_path(path)) return ImageFormat::metaimage;
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
    case ImageFormat::nrrd:
      return "nrrd";
    case ImageFormat::metaimage:
      return "metaimage";
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
    case ImageFormat::nrrd:
      return read_nrrd(path);
    case ImageFormat::metaimage:
      return read_metaimage(path);
    case ImageFormat::npy:
      return read_npy_image(path);
    case ImageFormat::dicom_file:
    case ImageFormat::dicom_folder:
      return read_dicom(path);
    case ImageFormat::unknown:
      break;
  }
  return unsupported(path.string() +
                     ": unknown image format: expected .nii, .nii.gz, .nrrd, .nhdr, .mha, .mhd, .npy, "
                     "a DICOM file or a folder with a DICOM series");
}

bool is_volume_path(const fs::path& path) {
  return is_nifti_path(path) || is_nrrd_path(path) || is_metaimage_path(path);
}

std::string image_stem(const fs::path& path) {
  const std::string n = path.filename().string();
  for (const char* ext : {".nii.gz", ".nii", ".nrrd", ".nhdr", ".mha", ".mhd", ".npy"}) {
    const std::string e = ext;
    if (n.size() > e.size() && n.ends_with(e)) return n.substr(0, n.size() - e.size());
  }
  return path.stem().string();
}

}  // namespace segflow::pipeline
