#include "pipeline/io/case_files.hpp"

#include <set>

#include "pipeline/io/dicom.hpp"
#include "pipeline/io/image_formats.hpp"

namespace segflow::pipeline {

namespace fs = std::filesystem;

bool is_hidden(const fs::path& p) {
  const auto n = p.filename().string();
  return n.empty() || n[0] == '.';
}

std::string image_stem(const fs::path& path) {
  const std::string n = path.filename().string();
  const std::string ending = format_ending(path);
  return ending.empty() ? path.stem().string() : n.substr(0, n.size() - ending.size());
}

std::string case_id_of(const fs::path& path) {
  const std::string n = path.filename().string();
  // A case suffix is longer than the format ending it ends with (".seg.nrrd", ".nrrd").
  for (const auto& info : image_formats())
    for (const auto& suffix : info.case_suffixes)
      if (n.size() > suffix.size() && n.ends_with(suffix)) return n.substr(0, n.size() - suffix.size());
  const std::string ending = format_ending(path);
  return n.substr(0, n.size() - ending.size());
}

std::string strip_channel_zero(const std::string& id) {
  return id.size() > 5 && id.ends_with("_0000") ? id.substr(0, id.size() - 5) : id;
}

bool is_side_file(const fs::path& p) {
  static const std::set<std::string> skip = {".json", ".csv",  ".txt", ".md",  ".pkl",
                                             ".npz",  ".yaml", ".yml", ".log", ".svg"};
  if (skip.count(p.extension().string())) return true;
  return case_id_of(p).ends_with("_probabilities");
}

bool is_detached_data(const fs::path& p) {
  const std::string n = p.filename().string();
  for (const auto& info : image_formats())
    for (const auto& e : info.data_extensions)
      if (n.ends_with(e)) return true;
  return false;
}

bool is_dicom_case_folder(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return false;
  for (const char* sub : {"labelsTr", "imagesTr", "imagesTs", "gts", "imgs"})
    if (fs::is_directory(dir / sub, ec)) return false;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_regular_file() || is_hidden(e.path())) continue;
    if (looks_like_dicom(e.path()) && !is_dicom_seg_file(e.path())) return true;
  }
  return false;
}

}  // namespace segflow::pipeline
