#include "pipeline/io/dataset.hpp"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <regex>

#include "pipeline/io/case_files.hpp"
#include "pipeline/io/image_io.hpp"

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

std::vector<fs::path> sorted_entries(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (!is_hidden(e.path())) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

/// The endings of the formats with geometry (".nii.gz", ".nii", ".nrrd", ...), in table order.
std::vector<std::string> volume_endings() {
  std::vector<std::string> out;
  for (const auto& info : image_formats())
    if (info.has_geometry) out.insert(out.end(), info.extensions.begin(), info.extensions.end());
  return out;
}

/// "not a NIfTI, NRRD or MetaImage file (.nii.gz, .nii, .nrrd, .nhdr, .mha, .mhd)".
std::string not_a_volume_message() {
  std::vector<std::string> titles;
  for (const auto& info : image_formats())
    if (info.has_geometry) titles.push_back(info.title);
  std::string s = "not a ";
  for (std::size_t i = 0; i < titles.size(); ++i)
    s += (i == 0 ? "" : i + 1 == titles.size() ? " or " : ", ") + titles[i];
  s += " file (";
  const auto endings = volume_endings();
  for (std::size_t i = 0; i < endings.size(); ++i) s += (i == 0 ? "" : ", ") + endings[i];
  return s + ")";
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

const std::regex& channel_suffix() {
  static const std::regex re("^(.*)_([0-9]{4})$");
  return re;
}

}  // namespace

bool has_channel_suffix(const std::string& stem) { return std::regex_match(stem, channel_suffix()); }

std::vector<ChannelCase> group_channels(const std::vector<std::pair<std::string, fs::path>>& files,
                                        std::vector<SkippedFile>& skipped) {
  std::map<std::string, std::map<int, fs::path>> by_case;
  for (const auto& [stem, p] : files) {
    std::smatch m;
    if (std::regex_match(stem, m, channel_suffix()))
      by_case[m[1]][std::stoi(m[2])] = p;
    else
      by_case[stem][0] = p;
  }
  std::vector<ChannelCase> out;
  for (auto& [id, chans] : by_case) {
    ChannelCase c{id, {}};
    for (auto& [n, p] : chans) {
      if (n != static_cast<int>(c.channels.size())) break;
      c.channels.push_back(p);
    }
    if (c.channels.size() == chans.size()) {
      out.push_back(std::move(c));
      continue;
    }
    char want[16];
    std::snprintf(want, sizeof want, "_%04d", static_cast<int>(c.channels.size()));
    skipped.push_back({chans.begin()->second, "case " + id + ": channel " + want +
                                                  " is missing (channels must be _0000, _0001, ...)"});
  }
  return out;
}

namespace {

void scan_msd(const fs::path& root, DatasetIndex& idx) {
  const fs::path images = root / "imagesTr", labels = root / "labelsTr";
  std::vector<std::pair<std::string, fs::path>> stems;
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
      idx.skipped.push_back({p, not_a_volume_message() + " in imagesTr/"});
      continue;
    }
    // MSD: one (possibly 4D) file per case; nnU-Net: one file per channel.
    stems.emplace_back(ending.empty() ? image_stem(p) : name.substr(0, name.size() - ending.size()), p);
  }
  for (auto& [id, channels] : group_channels(stems, idx.skipped)) {
    CaseEntry c;
    c.id = id;
    c.images = std::move(channels);
    const std::vector<std::string> exts =
        ending.empty() ? volume_endings() : std::vector<std::string>{ending};
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
    if (format_from_name(p) != ImageFormat::npy) {
      idx.skipped.push_back({p, "not an .npy file in imgs/"});
      continue;
    }
    CaseEntry c;
    c.id = image_stem(p);
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
    std::size_t images = 0;
    for (const auto& s : *series) {
      if (s.modality == "SEG") {
        if (!c.label && !s.files.empty()) c.label = s.files.front();
      } else {
        ++images;
      }
    }
    if (images == 0) {
      idx.skipped.push_back({dir, "case folder " + c.id + ": expected a DICOM image series, found none"});
      continue;
    }
    if (images > 1) {
      // Several series (localizers, other reconstructions): the case is the volume read_dicom
      // reads (the largest consistent stack), decided here from the headers so that a folder
      // with nothing readable is skipped now and what will not be read is listed.
      auto probe = probe_dicom(dir);
      if (!probe.is_ok()) {
        idx.skipped.push_back({dir, "case folder " + c.id + ": " + probe.status().message()});
        continue;
      }
      for (const auto& st : probe->skipped_stacks)
        idx.skipped.push_back({st.files.empty() ? dir : st.files.front(),
                               "case folder " + c.id + ": not read: " + st.stack + " (" +
                                   std::to_string(st.slices) + (st.slices == 1 ? " slice" : " slices") +
                                   "): " + st.reason});
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

/// Class names from the segment labels of the first case whose label is a DICOM SEG (later
/// SEGs are not read); empty when none names its segments or a case before it has a
/// NIfTI/NRRD/MetaImage label.
std::vector<std::string> seg_label_names(DatasetIndex& idx) {
  for (const auto& c : idx.cases) {
    if (!c.label) continue;
    if (c.label->extension() != ".dcm") return {};  // the labels are volumes, as dataset_label_names
    auto segments = read_dicom_seg_segments(*c.label);
    if (!segments.is_ok()) {
      idx.skipped.push_back(
          {*c.label, "segment labels not used as class names: " + segments.status().message()});
      continue;
    }
    return segment_class_names(*segments);
  }
  return {};
}

/// `label` (C, Z', Y', X') on the grid of an image (geometry `g`, size `size`) when the two
/// grids are one lattice of voxel centres whose axes are stored flipped or in another order
/// (a row axis stored bottom-up, say): each image axis is a label axis with the same step or
/// its opposite, and after reordering the geometry agrees within `tol` mm. The voxels are
/// only reindexed (nothing is interpolated). Empty when the grids are not such a pair.
std::optional<at::Tensor> reorder_onto_grid(const Image& label, const Geometry& g, const Size3& size,
                                            double tol) {
  const Geometry& l = label.geometry;
  const Size3 ls = label.size();
  std::array<int, 3> axis{};
  std::array<int, 3> sign{};
  std::array<bool, 3> used{};
  for (int a = 0; a < 3; ++a) {
    int best = -1;
    double best_dot = 0;
    for (int b = 0; b < 3; ++b) {
      double d = 0;
      for (int r = 0; r < 3; ++r) d += g.direction[r * 3 + a] * l.direction[r * 3 + b];
      if (std::abs(d) > std::abs(best_dot)) {
        best = b;
        best_dot = d;
      }
    }
    if (best < 0 || used[best] || std::abs(best_dot) < 1.0 - 1e-3 || ls[best] != size[a]) return std::nullopt;
    used[best] = true;
    axis[a] = best;
    sign[a] = best_dot > 0 ? 1 : -1;
  }
  // The grid of the reordered label: image axis a runs along label axis axis[a], from its
  // last voxel when flipped.
  Geometry r;
  r.origin = l.origin;
  for (int a = 0; a < 3; ++a) {
    const int b = axis[a];
    r.spacing[a] = l.spacing[b];
    for (int k = 0; k < 3; ++k) {
      r.direction[k * 3 + a] = sign[a] * l.direction[k * 3 + b];
      if (sign[a] < 0) r.origin[k] += l.direction[k * 3 + b] * l.spacing[b] * static_cast<double>(ls[b] - 1);
    }
  }
  if (!geometry_close(r, g, tol)) return std::nullopt;
  std::vector<std::int64_t> flips;
  for (int a = 0; a < 3; ++a)
    if (sign[a] < 0) flips.push_back(3 - axis[a]);  // label axis b is tensor dim 3 - b
  at::Tensor v = flips.empty() ? label.voxels : label.voxels.flip(flips);
  return v.permute({0, 3 - axis[2], 3 - axis[1], 3 - axis[0]}).contiguous();
}

bool is_integral_type(at::ScalarType t) {
  return t == at::kByte || t == at::kChar || t == at::kShort || t == at::kInt || t == at::kLong ||
         t == at::kUInt16 || t == at::kUInt32 || t == at::kUInt64 || t == at::kBool;
}

}  // namespace

std::vector<std::string> dataset_label_names(const fs::path& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return {};
  const fs::path dj = root / "dataset.json";
  if (fs::is_regular_file(dj, ec)) {
    std::ifstream f(dj);
    const auto j = nlohmann::json::parse(f, nullptr, false);
    if (!j.is_discarded() && j.is_object() && j.contains("labels")) {
      auto names = label_names_from_json(j["labels"]);
      if (!names.empty()) return names;
    }
  }
  if (fs::is_directory(root / "imagesTr", ec) || fs::is_directory(root / "imgs", ec)) return {};
  // A folder of DICOM case folders: the first case folder holding a SEG, as scan_dataset.
  // A case folder with a NIfTI/NRRD/MetaImage label and no SEG ends the search: the dataset's
  // labels are volumes (and the headers of every other case's files are not read).
  for (const auto& dir : sorted_entries(root)) {
    if (!fs::is_directory(dir, ec)) continue;
    bool volume_label = false;
    for (const auto& p : sorted_entries(dir)) {
      if (is_volume_path(p)) {
        volume_label = true;
        continue;
      }
      if (!is_dicom_seg_file(p)) continue;
      auto segments = read_dicom_seg_segments(p);
      return segments.is_ok() ? segment_class_names(*segments) : std::vector<std::string>{};
    }
    if (volume_label) return {};
  }
  return {};
}

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
    if (idx.label_names.empty()) idx.label_names = seg_label_names(idx);
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
      // A label stored on the image's lattice with flipped or permuted axes is reindexed onto
      // the image's grid (through patient coordinates; nothing interpolated).
      if (!geometry_close(label.geometry, out.image.geometry, 1e-3)) {
        if (auto v = reorder_onto_grid(label, out.image.geometry, out.image.size(), 1e-3)) {
          label.voxels = *v;
          label.geometry = out.image.geometry;
        }
      }
      auto ls = label.size(), is = out.image.size();
      if (ls != is)
        return corrupt_data(lp.string() + ": label size [" + std::to_string(ls[0]) + ", " +
                            std::to_string(ls[1]) + ", " + std::to_string(ls[2]) +
                            "] does not match image size [" + std::to_string(is[0]) + ", " +
                            std::to_string(is[1]) + ", " + std::to_string(is[2]) + "]");
      if (!geometry_close(label.geometry, out.image.geometry, 1e-3))
        return corrupt_data(lp.string() +
                            ": label geometry does not match the image (nor is it the image's " +
                            "grid with axes flipped or permuted): label " + describe(label.geometry) +
                            ", image " + describe(out.image.geometry));
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
