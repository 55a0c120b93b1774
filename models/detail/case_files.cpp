#include "models/detail/case_files.hpp"

#include <set>

#include "pipeline/io/dicom.hpp"

namespace segflow::models::detail {

namespace fs = std::filesystem;

bool is_hidden(const fs::path& p) {
  const auto n = p.filename().string();
  return n.empty() || n[0] == '.';
}

std::string case_id_of(const fs::path& path) {
  std::string n = path.filename().string();
  for (const char* ext : {".nii.gz", ".seg.nrrd", ".seg.dcm", ".nii", ".npy", ".nrrd", ".nhdr", ".mha",
                          ".mhd", ".dcm", ".DCM"}) {
    const std::string e = ext;
    if (n.size() > e.size() && n.ends_with(e)) return n.substr(0, n.size() - e.size());
  }
  return n;
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

bool is_dicom_case_folder(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return false;
  for (const char* sub : {"labelsTr", "imagesTr", "imagesTs", "gts", "imgs"})
    if (fs::is_directory(dir / sub, ec)) return false;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_regular_file() || is_hidden(e.path())) continue;
    if (pipeline::looks_like_dicom(e.path()) && !pipeline::is_dicom_seg_file(e.path())) return true;
  }
  return false;
}

}  // namespace segflow::models::detail
