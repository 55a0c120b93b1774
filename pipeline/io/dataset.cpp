#include "pipeline/io/dataset.hpp"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <map>
#include <regex>

#include "pipeline/io/image_io.hpp"
#include "pipeline/io/nifti.hpp"

namespace segflow::pipeline {

namespace fs = std::filesystem;

const char* to_string(DatasetLayout l) {
  switch (l) {
    case DatasetLayout::msd:
      return "msd";
    case DatasetLayout::dicom:
      return "dicom";
    case DatasetLayout::medsam_npy:
      return "medsam-npy";
  }
  return "unknown";
}

namespace {

bool hidden(const fs::path& p) {
  const auto n = p.filename().string();
  return n.empty() || n[0] == '.';  // includes macOS "._x.nii.gz" resource forks in MSD tarballs
}

/// Name without its image extension (.nii.gz, .nrrd, .mha, .npy, ...).
std::string stem_of(const fs::path& p) { return image_stem(p); }

/// The data file of a detached header (.nhdr -> x.raw / x.raw.gz, .mhd -> x.raw / x.zraw):
/// read through its header, not a case of its own.
bool is_detached_data(const fs::path& p) {
  const std::string n = p.filename().string();
  return n.ends_with(".raw") || n.ends_with(".raw.gz") || n.ends_with(".zraw");
}

std::vector<fs::path> sorted_entries(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (!hidden(e.path())) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::vector<std::string> label_names_from_json(const nlohmann::json& labels) {
  if (!labels.is_object()) return {};
  std::map<int, std::string> m;
  for (auto it = labels.begin(); it != labels.end(); ++it) {
    if (it->is_string()) {
      try {
        m[std::stoi(it.key())] = it->get<std::string>();
      } catch (...) {
      }
    } else if (it->is_number_integer()) {
      m[it->get<int>()] = it.key();
    }
  }
  std::vector<std::string> out;
  if (m.empty() || m.begin()->first < 0 || m.rbegin()->first > 65535) return out;
  out.resize(static_cast<std::size_t>(m.rbegin()->first) + 1);
  for (auto& [k, v] : m) out[static_cast<std::size_t>(k)] = v;
  return out;
}

namespace {

void scan_msd(const fs::path& root, DatasetIndex& idx) {
  const fs::path images = root / "imagesTr", labels = root / "labelsTr";
  static const std::regex channel_re("^(.*)_([0-9]{4})$");
  std::map<std::string, std::map<int, fs::path>> channels;
  const std::string& ending = idx.file_ending;
  for (const auto& p : sorted_entries(images)) {
    if (is_detached_data(p)) continue;
    const std::string name = p.filename().string();
    if (!ending.empty() && !(name.size() > ending.size() && name.ends_with(ending))) {
      idx.skipped.push_back(
          {p, "does not end with dataset.json's file_ending \"" + ending + "\" in imagesTr/"});
      continue;
    }
    if (!is_volume_path(p)) {
      idx.skipped.push_back(
          {p, "not a NIfTI, NRRD or MetaImage file (.nii.gz, .nii, .nrrd, .nhdr, .mha, .mhd) in imagesTr/"});
      continue;
    }
    std::string s = ending.empty() ? stem_of(p) : name.substr(0, name.size() - ending.size());
    std::smatch m;
    if (std::regex_match(s, m, channel_re))
      channels[m[1]][std::stoi(m[2])] = p;
    else
      channels[s][0] = p;  // MSD: one (possibly 4D) file per case
  }
  for (auto& [id, chans] : channels) {
    CaseEntry c;
    c.id = id;
    int expect = 0;
    bool ok = true;
    for (auto& [n, p] : chans) {
      if (n != expect++) {
        idx.skipped.push_back(
            {chans.begin()->second, "case " + id + ": channel _" + std::to_string(expect - 1) +
                                        " is missing (channels must be _0000, _0001, ...)"});
        ok = false;
        break;
      }
      c.images.push_back(p);
    }
    if (!ok) continue;
    const std::vector<std::string> exts =
        ending.empty() ? std::vector<std::string>{".nii.gz", ".nii", ".nrrd", ".nhdr", ".mha", ".mhd"}
                       : std::vector<std::string>{ending};
    for (const auto& ext : exts) {
      fs::path l = labels / (id + ext);
      if (fs::exists(l)) {
        c.label = l;
        break;
      }
    }
    idx.cases.push_back(std::move(c));
  }
}

void scan_medsam(const fs::path& root, DatasetIndex& idx) {
  for (const auto& p : sorted_entries(root / "imgs")) {
    if (p.extension() != ".npy") {
      idx.skipped.push_back({p, "not an .npy file in imgs/"});
      continue;
    }
    CaseEntry c;
    c.id = stem_of(p);
    c.images.push_back(p);
    fs::path gt = root / "gts" / p.filename();
    if (!fs::exists(gt)) {
      idx.skipped.push_back({p, "no matching label gts/" + p.filename().string()});
      continue;
    }
    c.label = gt;
    idx.cases.push_back(std::move(c));
  }
}

void scan_dicom_cases(const fs::path& root, DatasetIndex& idx) {
  for (const auto& dir : sorted_entries(root)) {
    if (!fs::is_directory(dir)) continue;
    std::vector<SkippedFile> bad;
    auto series = scan_dicom_folder(dir, &bad);
    for (auto& b : bad) idx.skipped.push_back(b);
    if (!series.is_ok()) {
      idx.skipped.push_back({dir, series.status().message()});
      continue;
    }
    CaseEntry c;
    c.id = dir.filename().string();
    std::vector<const DicomSeriesInfo*> images;
    for (const auto& s : *series) {
      if (s.modality == "SEG") {
        if (!s.files.empty()) c.label = s.files.front();
      } else {
        images.push_back(&s);
      }
    }
    if (images.size() != 1) {
      idx.skipped.push_back({dir, "case folder " + c.id + ": expected exactly one image series, found " +
                                      std::to_string(images.size())});
      continue;
    }
    c.images.push_back(dir);
    if (!c.label) {
      for (const auto& p : sorted_entries(dir))
        if (is_volume_path(p)) {
          c.label = p;
          break;
        }
    }
    idx.cases.push_back(std::move(c));
  }
}

bool is_integral_type(at::ScalarType t) {
  return t == at::kByte || t == at::kChar || t == at::kShort || t == at::kInt || t == at::kLong ||
         t == at::kUInt16 || t == at::kUInt32 || t == at::kUInt64 || t == at::kBool;
}

}  // namespace

Result<DatasetIndex> scan_dataset(const fs::path& root, const ScanOptions& opts) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return not_found(root.string() + ": not a folder");
  DatasetIndex idx;
  idx.root = root;
  const fs::path dj = root / "dataset.json";
  if (fs::exists(dj)) {
    try {
      std::ifstream f(dj);
      auto j = nlohmann::json::parse(f);
      if (j.contains("labels")) idx.label_names = label_names_from_json(j["labels"]);
      if (j.contains("file_ending") && j["file_ending"].is_string()) idx.file_ending = j["file_ending"];
    } catch (const std::exception& e) {
      idx.skipped.push_back({dj, std::string("invalid JSON, label names ignored: ") + e.what()});
    }
  }
  if (fs::is_directory(root / "imagesTr")) {
    idx.layout = DatasetLayout::msd;
    scan_msd(root, idx);
  } else if (fs::is_directory(root / "imgs") && fs::is_directory(root / "gts")) {
    idx.layout = DatasetLayout::medsam_npy;
    scan_medsam(root, idx);
  } else {
    idx.layout = DatasetLayout::dicom;
    scan_dicom_cases(root, idx);
    if (idx.cases.empty() && idx.skipped.empty())
      return invalid_argument(root.string() +
                              ": unknown dataset layout: expected imagesTr/ (MSD, nnU-Net), imgs/ "
                              "and gts/ (MedSAM npy), or case folders with DICOM series");
  }
  if (opts.validate) {
    std::vector<CaseEntry> good;
    for (auto& c : idx.cases) {
      auto loaded = load_case(c);
      if (loaded.is_ok())
        good.push_back(std::move(c));
      else
        idx.skipped.push_back({c.images.empty() ? root : c.images.front(), loaded.status().message()});
    }
    idx.cases = std::move(good);
  }
  return idx;
}

Result<LoadedCase> load_case(const CaseEntry& entry) {
  try {
    LoadedCase out;
    out.id = entry.id;
    if (entry.images.empty()) return invalid_argument("case " + entry.id + ": no image");
    std::vector<at::Tensor> chans;
    for (const auto& p : entry.images) {
      SEGFLOW_ASSIGN_OR_RETURN(Image img, read_image(p));
      if (chans.empty()) {
        out.image = img;
      } else if (img.size() != out.image.size() || !geometry_close(img.geometry, out.image.geometry, 1e-3)) {
        return corrupt_data(p.string() + ": channel grid differs from " + entry.images.front().string() +
                            " (" + describe(img.geometry) + " vs " + describe(out.image.geometry) + ")");
      }
      chans.push_back(img.voxels.to(torch::kFloat32));
    }
    out.image.voxels = chans.size() == 1 ? chans[0].contiguous() : torch::cat(chans, 0).contiguous();
    if (entry.label) {
      const fs::path& lp = *entry.label;
      Image label;
      if (lp.extension() == ".dcm" && !fs::is_directory(lp)) {
        SEGFLOW_ASSIGN_OR_RETURN(label, read_dicom_seg(lp, out.image));
      } else {
        SEGFLOW_ASSIGN_OR_RETURN(label, read_image(lp));
      }
      if (label.channels() != 1)
        return corrupt_data(lp.string() + ": label map: expected 1 channel, got " +
                            std::to_string(label.channels()));
      auto ls = label.size(), is = out.image.size();
      if (ls != is)
        return corrupt_data(lp.string() + ": label size [" + std::to_string(ls[0]) + ", " +
                            std::to_string(ls[1]) + ", " + std::to_string(ls[2]) +
                            "] does not match image size [" + std::to_string(is[0]) + ", " +
                            std::to_string(is[1]) + ", " + std::to_string(is[2]) + "]");
      if (!geometry_close(label.geometry, out.image.geometry, 1e-3))
        return corrupt_data(lp.string() + ": label geometry does not match the image: label " +
                            describe(label.geometry) + ", image " + describe(out.image.geometry));
      at::Tensor v = label.voxels;
      if (!is_integral_type(v.scalar_type())) {
        if (!torch::equal(v, v.round()))
          return corrupt_data(lp.string() + ": label map: expected integer values, got fractions");
      }
      const double mn = v.min().item<double>(), mx = v.max().item<double>();
      if (mn < 0)
        return corrupt_data(lp.string() + ": label map: expected values >= 0, got " + std::to_string(mn));
      label.voxels = (mx < 256 ? v.to(torch::kUInt8) : v.to(torch::kInt64)).contiguous();
      out.label = std::move(label);
    }
    return out;
  } catch (const std::exception& e) {
    return internal_error("case " + entry.id + ": " + e.what());
  }
}

}  // namespace segflow::pipeline
