#include "pipeline/inspect.hpp"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>

#include "pipeline/io/dataset.hpp"
#include "pipeline/io/dicom.hpp"
#include "pipeline/io/image_io.hpp"

namespace segflow::pipeline {

namespace fs = std::filesystem;

namespace {

bool integral(const at::Tensor& t) {
  return !at::isFloatingType(t.scalar_type()) && !at::isComplexType(t.scalar_type());
}

/// A file that holds a label map: a DICOM SEG, or an integer image whose path says so
/// (labelsTr/, gts/, or a name with label, seg, mask or gt in it).
bool looks_like_label(const Image& img, const fs::path& p) {
  if (img.modality == "SEG") return true;
  if (!integral(img.voxels)) return false;
  const std::string parent = p.parent_path().filename().string();
  if (parent == "labelsTr" || parent == "labelsTs" || parent == "gts") return true;
  std::string name = p.filename().string();
  std::transform(name.begin(), name.end(), name.begin(), ::tolower);
  for (const char* w : {"label", "seg", "mask", "gt"})
    if (name.find(w) != std::string::npos) return true;
  return false;
}

nlohmann::json distinct_values(const at::Tensor& t) {
  at::Tensor u = std::get<0>(at::_unique(t.flatten().to(torch::kInt64), /*sorted=*/true));
  nlohmann::json out = nlohmann::json::array();
  auto a = u.accessor<std::int64_t, 1>();
  for (std::int64_t i = 0; i < a.size(0); ++i) out.push_back(a[i]);
  return out;
}

/// Names of the label values in `labels` from a dataset.json in `dir` or its parent (an MSD
/// root holds labelsTr/; a DICOM dataset root holds the case folders): {"1": "spleen", ...}.
nlohmann::json label_names_near(const fs::path& dir, const nlohmann::json& labels) {
  nlohmann::json out = nlohmann::json::object();
  for (const fs::path& d : {dir, dir.parent_path()}) {
    std::error_code ec;
    if (d.empty() || !fs::is_regular_file(d / "dataset.json", ec)) continue;
    std::ifstream f(d / "dataset.json");
    const auto j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("labels")) return out;
    const auto names = label_names_from_json(j["labels"]);
    for (const auto& v : labels) {
      const auto k = v.get<std::int64_t>();
      if (k >= 0 && k < static_cast<std::int64_t>(names.size()) && !names[k].empty())
        out[std::to_string(k)] = names[k];
    }
    return out;
  }
  return out;
}

nlohmann::json describe_image(const Image& img) {
  const Size3 s = img.size();
  at::Tensor d = img.voxels.to(torch::kFloat64);
  nlohmann::json j;
  j["size"] = {s[0], s[1], s[2]};
  j["spacing"] = img.geometry.spacing;
  j["origin"] = img.geometry.origin;
  j["direction"] = img.geometry.direction;
  j["channels"] = img.channels();
  j["dtype"] = dtype_name(img.voxels);
  j["min"] = d.min().item<double>();
  j["max"] = d.max().item<double>();
  j["mean"] = d.mean().item<double>();
  if (!img.modality.empty()) j["modality"] = img.modality;
  return j;
}

/// A case folder: one DICOM image series with a SEG or a NIfTI label beside it.
Result<nlohmann::json> inspect_case_folder(const fs::path& dir) {
  std::vector<SkippedFile> skipped;
  SEGFLOW_ASSIGN_OR_RETURN(auto series, scan_dicom_folder(dir, &skipped));
  CaseEntry c;
  c.id = dir.filename().string();
  c.images.push_back(dir);
  for (const auto& s : series)
    if (s.modality == "SEG" && !s.files.empty()) c.label = s.files.front();
  if (!c.label) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      if (is_volume_path(e.path())) {
        c.label = e.path();
        break;
      }
    }
  }
  SEGFLOW_ASSIGN_OR_RETURN(auto loaded, load_case(c));
  nlohmann::json j = describe_image(loaded.image);
  j["path"] = dir.string();
  j["format"] = "dicom";
  if (loaded.label) {
    j["labels"] = distinct_values(loaded.label->voxels);
    j["label_path"] = c.label->string();
    if (auto names = label_names_near(dir.parent_path(), j["labels"]); !names.empty())
      j["label_names"] = names;
  }
  if (!skipped.empty()) {
    j["skipped"] = nlohmann::json::array();
    for (auto& s : skipped) j["skipped"].push_back({{"path", s.path.string()}, {"reason", s.reason}});
  }
  return j;
}

Result<nlohmann::json> inspect_dataset(const fs::path& root) {
  SEGFLOW_ASSIGN_OR_RETURN(auto idx, scan_dataset(root, ScanOptions{.validate = true}));
  nlohmann::json j;
  j["path"] = root.string();
  j["layout"] = to_string(idx.layout);
  j["cases"] = idx.cases.size();
  j["label_names"] = idx.label_names;
  j["skipped"] = nlohmann::json::array();
  for (auto& s : idx.skipped) j["skipped"].push_back({{"path", s.path.string()}, {"reason", s.reason}});
  j["case_ids"] = nlohmann::json::array();
  for (auto& c : idx.cases) j["case_ids"].push_back(c.id);
  return j;
}

}  // namespace

Result<nlohmann::json> inspect_path(const fs::path& path) {
  try {
    std::error_code ec;
    if (!fs::exists(path, ec)) return not_found(path.string() + ": no such file or folder");
    if (fs::is_directory(path)) {
      if (fs::is_directory(path / "imagesTr") || fs::is_directory(path / "imgs") ||
          fs::exists(path / "dataset.json"))
        return inspect_dataset(path);
      std::vector<SkippedFile> skipped;
      auto series = scan_dicom_folder(path, &skipped);
      if (series.is_ok() && !series->empty()) {
        const bool has_seg = std::any_of(series->begin(), series->end(),
                                         [](const DicomSeriesInfo& s) { return s.modality == "SEG"; });
        bool has_volume = false;
        for (const auto& e : fs::directory_iterator(path, ec)) has_volume |= is_volume_path(e.path());
        if (has_seg || has_volume) return inspect_case_folder(path);
      }
      // A folder of case folders: a DICOM dataset.
      bool has_subdirs = false;
      for (const auto& e : fs::directory_iterator(path, ec)) has_subdirs |= e.is_directory();
      if (has_subdirs && (!series.is_ok() || series->empty())) return inspect_dataset(path);
    }
    // DICOM: also what the series read decided (stack, spacing evenness, skipped stacks).
    const ImageFormat format = detect_format(path);
    const bool dicom = format == ImageFormat::dicom_file || format == ImageFormat::dicom_folder;
    DicomReadReport dicom_report;
    SEGFLOW_ASSIGN_OR_RETURN(Image img, dicom ? read_dicom(path, &dicom_report) : read_image(path));
    nlohmann::json j = describe_image(img);
    j["path"] = path.string();
    j["format"] = to_string(format);
    if (dicom && dicom_report.slices > 0) j.update(nlohmann::json(dicom_report));
    if (looks_like_label(img, path)) {
      j["labels"] = distinct_values(img.voxels);
      if (auto names = label_names_near(path.parent_path(), j["labels"]); !names.empty())
        j["label_names"] = names;
    }
    return j;
  } catch (const std::exception& e) {
    return internal_error(path.string() + ": " + e.what());
  }
}

}  // namespace segflow::pipeline
