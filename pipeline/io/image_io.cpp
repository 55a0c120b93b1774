#include "pipeline/io/image_io.hpp"

namespace segflow::pipeline {

namespace fs = std::filesystem;

namespace {

/// What the table reads: ".nii.gz, .nii, ..., a DICOM file or a folder with a DICOM series".
std::string known_formats() {
  std::string s;
  for (const auto& info : image_formats()) {
    if (info.by_content || info.folder) continue;
    for (const auto& e : info.extensions) s += e + ", ";
  }
  std::vector<std::string> others;
  for (const auto& info : image_formats()) {
    if (info.by_content) others.push_back(std::string("a ") + info.title + " file");
    if (info.folder) others.push_back(std::string("a folder with a ") + info.title);
  }
  for (std::size_t i = 0; i < others.size(); ++i)
    s += (i == 0 ? "" : i + 1 == others.size() ? " or " : ", ") + others[i];
  return s;
}

}  // namespace

ImageFormat detect_format(const fs::path& path) {
  std::error_code ec;
  const bool folder = fs::is_directory(path, ec);
  if (!folder)
    if (ImageFormat f = format_from_name(path); f != ImageFormat::unknown) return f;
  for (const auto& info : image_formats()) {
    if (folder ? info.folder : info.by_content && info.by_content(path)) return info.format;
  }
  return ImageFormat::unknown;
}

Result<Image> read_image(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return not_found(path.string() + ": no such file or folder");
  const ImageFormatInfo* info = image_format_info(detect_format(path));
  if (!info || !info->read)
    return unsupported(path.string() + ": unknown image format: expected " + known_formats());
  return info->read(path);
}

Status write_image(const fs::path& path, const Image& image) {
  const ImageFormatInfo* info = image_format_info(format_from_name(path));
  if (!info || !info->write) {
    std::string writable;
    for (const auto& f : image_formats())
      for (const auto& e : f.write ? f.extensions : std::vector<std::string>{})
        writable += (writable.empty() ? "" : ", ") + e;
    return unsupported(path.string() + ": cannot write this format: expected a name ending in " + writable);
  }
  return info->write(path, image);
}

bool is_volume_path(const fs::path& path) {
  const ImageFormatInfo* info = image_format_info(format_from_name(path));
  return info && info->has_geometry;
}

}  // namespace segflow::pipeline
