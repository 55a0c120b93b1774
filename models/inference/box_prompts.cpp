// Box prompts of box-prompted inference: box files (JSON, CSV; voxel or patient coordinates)
// and boxes of a label map (models/inference/box_inference.hpp).
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "models/inference/box_inference.hpp"
#include "pipeline/io/case_files.hpp"
#include "pipeline/io/image.hpp"

namespace segflow::models {

namespace box_prompt_detail {

namespace fs = std::filesystem;
using nlohmann::json;

/// One box entry as read: its fields by name, as text (CSV) or JSON values.
struct RawBox {
  std::string where;  ///< "boxes[2]" or "line 4"
  std::map<std::string, json> fields;
};

/// The columns a box needs in each coordinate space.
const std::vector<std::string>& required_fields(bool patient) {
  static const std::vector<std::string> voxel = {"label", "slice", "x0", "y0", "x1", "y1"};
  static const std::vector<std::string> mm = {"label", "x0", "y0", "z0", "x1", "y1", "z1"};
  return patient ? mm : voxel;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

/// Continuous voxel index (x, y, z) of an LPS point: diag(1 / spacing) D^T (p - origin).
std::array<double, 3> physical_to_index(const Geometry& g, const std::array<double, 3>& p) {
  std::array<double, 3> idx{};
  for (int c = 0; c < 3; ++c) {
    double s = 0;
    for (int r = 0; r < 3; ++r) s += g.direction[r * 3 + c] * (p[r] - g.origin[r]);
    idx[c] = s / g.spacing[c];
  }
  return idx;
}

/// A value within 1e-3 of an integer becomes that integer (round trips through mm).
double snap(double v) {
  const double r = std::round(v);
  return std::abs(v - r) < 1e-3 ? r : v;
}

Result<std::vector<RawBox>> parse_json_boxes(const fs::path& file, const std::string& text, bool& patient) {
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    return invalid_argument(file.string() + ": not valid JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains("boxes") || !j["boxes"].is_array())
    return invalid_argument(
        file.string() + ": boxes: expected an object {\"space\": \"voxel\" | \"patient\", \"boxes\": [...]}");
  const std::string space = j.value("space", std::string("voxel"));
  if (space != "voxel" && space != "patient")
    return invalid_argument(file.string() + ": space: expected \"voxel\" or \"patient\", got \"" + space +
                            "\"");
  patient = space == "patient";
  std::vector<RawBox> out;
  for (std::size_t i = 0; i < j["boxes"].size(); ++i) {
    const json& b = j["boxes"][i];
    RawBox r{"boxes[" + std::to_string(i) + "]", {}};
    if (!b.is_object()) return invalid_argument(file.string() + ": " + r.where + ": expected an object");
    for (const auto& [k, v] : b.items()) r.fields[k] = v;
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream ss(line);
  std::string cell;
  while (std::getline(ss, cell, ',')) {
    const auto a = cell.find_first_not_of(" \t\r"), b = cell.find_last_not_of(" \t\r");
    out.push_back(a == std::string::npos ? "" : cell.substr(a, b - a + 1));
  }
  return out;
}

Result<std::vector<RawBox>> parse_csv_boxes(const fs::path& file, const std::string& text, bool& patient) {
  std::stringstream in(text);
  std::string line;
  std::vector<std::string> header;
  std::vector<RawBox> out;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos || line[line.find_first_not_of(" \t")] == '#')
      continue;
    std::vector<std::string> cells = split_csv_line(line);
    if (header.empty()) {
      header = cells;
      patient = std::find(header.begin(), header.end(), "z0") != header.end();
      continue;
    }
    RawBox r{"line " + std::to_string(n), {}};
    if (cells.size() != header.size())
      return invalid_argument(file.string() + ": " + r.where + ": expected " + std::to_string(header.size()) +
                              " columns (" + joined(header) + "), got " + std::to_string(cells.size()));
    for (std::size_t c = 0; c < cells.size(); ++c) {
      char* end = nullptr;
      const double v = std::strtod(cells[c].c_str(), &end);
      r.fields[header[c]] = (!cells[c].empty() && *end == '\0') ? json(v) : json(cells[c]);
    }
    out.push_back(std::move(r));
  }
  if (header.empty())
    return invalid_argument(file.string() +
                            ": expected a header line (label,slice,x0,y0,x1,y1 or "
                            "label,x0,y0,z0,x1,y1,z1), got an empty file");
  return out;
}

/// The label of an entry: an integer >= 1, or a name of `names`.
Result<std::int64_t> label_of(const fs::path& file, const RawBox& r, const std::vector<std::string>& names) {
  const json& v = r.fields.at("label");
  const std::string field = file.string() + ": " + r.where + ".label";
  std::string known;
  for (std::size_t i = 1; i < names.size(); ++i)
    known += (known.empty() ? "" : ", ") + std::to_string(i) + " (" + names[i] + ")";
  const std::string expected =
      names.size() > 1 ? "expected one of " + known : std::string("expected an integer >= 1");
  if (v.is_string()) {
    for (std::size_t i = 1; i < names.size(); ++i)
      if (names[i] == v.get<std::string>()) return static_cast<std::int64_t>(i);
    return invalid_argument(field + ": unknown label \"" + v.get<std::string>() + "\"; " + expected);
  }
  if (!v.is_number() || v.get<double>() != std::floor(v.get<double>()) || v.get<double>() < 1 ||
      v.get<double>() > 65535)
    return invalid_argument(field + ": " + expected + ", got " + v.dump());
  const auto label = static_cast<std::int64_t>(v.get<double>());
  if (names.size() > 1 && label >= static_cast<std::int64_t>(names.size()))
    return invalid_argument(field + ": unknown label " + std::to_string(label) + "; " + expected);
  return label;
}

/// A numeric field of an entry.
Result<double> number_of(const fs::path& file, const RawBox& r, const std::string& key) {
  const json& v = r.fields.at(key);
  if (!v.is_number())
    return invalid_argument(file.string() + ": " + r.where + "." + key + ": expected a number, got " +
                            v.dump());
  return v.get<double>();
}

/// A number as written: integers without decimals ("40"), else up to 6 significant digits.
std::string num_text(double v) {
  if (v == std::floor(v) && std::abs(v) < 1e15) return std::to_string(static_cast<long long>(v));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

/// Checks a voxel box against the grid: inside, non-empty, on an existing slice.
Status check_box(const fs::path& file, const RawBox& r, const SliceBox& b, const Size3& size) {
  const std::string at = file.string() + ": " + r.where;
  auto range = [&](const char* key, double v, std::int64_t n, const char* what) -> Status {
    if (v < 0 || v > static_cast<double>(n - 1))
      return invalid_argument(at + "." + key + ": expected a voxel index in [0, " + std::to_string(n - 1) +
                              "] (the image's " + what + "), got " + num_text(v));
    return Status::ok();
  };
  SEGFLOW_RETURN_IF_ERROR(range("slice", static_cast<double>(b.slice), size[2], "slices"));
  SEGFLOW_RETURN_IF_ERROR(range("x0", b.x0, size[0], "columns"));
  SEGFLOW_RETURN_IF_ERROR(range("x1", b.x1, size[0], "columns"));
  SEGFLOW_RETURN_IF_ERROR(range("y0", b.y0, size[1], "rows"));
  SEGFLOW_RETURN_IF_ERROR(range("y1", b.y1, size[1], "rows"));
  if (b.x1 < b.x0 || b.y1 < b.y0)
    return invalid_argument(at + ": expected x0 <= x1 and y0 <= y1 (an empty box), got x " + num_text(b.x0) +
                            ".." + num_text(b.x1) + ", y " + num_text(b.y0) + ".." + num_text(b.y1));
  return Status::ok();
}

/// One entry as a voxel box (patient corners mapped through the image's geometry).
Result<SliceBox> to_slice_box(const fs::path& file, const RawBox& r, bool patient,
                              const pipeline::Image& image, const std::vector<std::string>& names) {
  const auto& need = required_fields(patient);
  for (const auto& k : need)
    if (!r.fields.count(k))
      return invalid_argument(file.string() + ": " + r.where + ": missing field '" + k + "' (expected " +
                              joined(need) + " for space " + (patient ? "patient" : "voxel") + ")");
  SliceBox b;
  SEGFLOW_ASSIGN_OR_RETURN(b.label, label_of(file, r, names));
  std::array<double, 6> v{};
  const std::vector<std::string> keys = patient ? std::vector<std::string>{"x0", "y0", "z0", "x1", "y1", "z1"}
                                                : std::vector<std::string>{"x0", "y0", "x1", "y1"};
  for (std::size_t i = 0; i < keys.size(); ++i) {
    SEGFLOW_ASSIGN_OR_RETURN(v[i], number_of(file, r, keys[i]));
  }
  if (!patient) {
    SEGFLOW_ASSIGN_OR_RETURN(const double z, number_of(file, r, "slice"));
    if (z != std::floor(z))
      return invalid_argument(file.string() + ": " + r.where + ".slice: expected an integer, got " +
                              num_text(z));
    b.slice = static_cast<std::int64_t>(z);
    b.x0 = v[0], b.y0 = v[1], b.x1 = v[2], b.y1 = v[3];
  } else {
    const auto c0 = physical_to_index(image.geometry, {v[0], v[1], v[2]});
    const auto c1 = physical_to_index(image.geometry, {v[3], v[4], v[5]});
    const auto s0 = std::llround(c0[2]), s1 = std::llround(c1[2]);
    if (s0 != s1)
      return invalid_argument(file.string() + ": " + r.where +
                              ".z1: expected a corner on the slice of z0 (slice " + std::to_string(s0) +
                              "), got slice " + std::to_string(s1));
    b.slice = s0;
    b.x0 = snap(std::min(c0[0], c1[0])), b.x1 = snap(std::max(c0[0], c1[0]));
    b.y0 = snap(std::min(c0[1], c1[1])), b.y1 = snap(std::max(c0[1], c1[1]));
  }
  SEGFLOW_RETURN_IF_ERROR(check_box(file, r, b, image.size()));
  return b;
}

/// [lo, hi] of the true entries of a 1-D bool tensor (at least one).
std::pair<std::int64_t, std::int64_t> true_extent(const at::Tensor& any) {
  const at::Tensor nz = any.nonzero().flatten();
  return {nz.min().item<std::int64_t>(), nz.max().item<std::int64_t>()};
}

SliceBox box_of_mask(std::int64_t label, std::int64_t z, const at::Tensor& mask2d) {
  SliceBox b;
  b.label = label;
  b.slice = z;
  const auto [y0, y1] = true_extent(mask2d.any(1));
  const auto [x0, x1] = true_extent(mask2d.any(0));
  b.x0 = static_cast<double>(x0), b.x1 = static_cast<double>(x1);
  b.y0 = static_cast<double>(y0), b.y1 = static_cast<double>(y1);
  return b;
}

/// Distinct positive values of a label map, ascending.
std::vector<std::int64_t> positive_labels(const at::Tensor& labels) {
  const at::Tensor u = std::get<0>(at::_unique(labels.flatten().to(at::kLong), true));
  std::vector<std::int64_t> out;
  for (std::int64_t i = 0; i < u.numel(); ++i)
    if (u[i].item<std::int64_t>() > 0) out.push_back(u[i].item<std::int64_t>());
  return out;
}

}  // namespace box_prompt_detail

Result<std::vector<SliceBox>> read_box_file(const std::filesystem::path& file, const pipeline::Image& image,
                                            const std::vector<std::string>& names) {
  using namespace box_prompt_detail;
  std::ifstream in(file, std::ios::binary);
  if (!in) return not_found(file.string() + ": --boxes: cannot open the file");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string ext = file.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  if (ext != ".json" && ext != ".csv")
    return invalid_argument(file.string() + ": --boxes: expected a .json or .csv file, got '" + ext + "'");
  bool patient = false;
  Result<std::vector<RawBox>> raw =
      ext == ".json" ? parse_json_boxes(file, ss.str(), patient) : parse_csv_boxes(file, ss.str(), patient);
  if (!raw.is_ok()) return raw.status();
  if (raw->empty()) return invalid_argument(file.string() + ": boxes: expected at least one box, got none");
  std::vector<SliceBox> out;
  for (const RawBox& r : *raw) {
    SEGFLOW_ASSIGN_OR_RETURN(SliceBox b, to_slice_box(file, r, patient, image, names));
    out.push_back(b);
  }
  return out;
}

std::filesystem::path prompt_file_for(const std::filesystem::path& dir, const std::string& id,
                                      bool box_file) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string ext = e.path().extension().string();
    if (box_file && ext != ".json" && ext != ".csv") continue;
    if (box_file ? e.path().stem().string() == id
                 : pipeline::strip_channel_zero(pipeline::case_id_of(e.path())) == id)
      return e.path();
  }
  return {};
}

std::vector<SliceBox> boxes_from_label_map(const at::Tensor& labels) {
  using namespace box_prompt_detail;
  const at::Tensor lab = labels.dim() == 4 ? labels[0] : labels;  // (Z, Y, X)
  std::vector<SliceBox> out;
  for (std::int64_t v : positive_labels(lab)) {
    const at::Tensor m = lab == v;
    const at::Tensor zs = m.flatten(1).any(1).nonzero().flatten();
    for (std::int64_t i = 0; i < zs.numel(); ++i) {
      const std::int64_t z = zs[i].item<std::int64_t>();
      out.push_back(box_of_mask(v, z, m[z]));
    }
  }
  return out;
}

std::vector<SliceBox> seed_boxes_from_label_map(const at::Tensor& labels) {
  using namespace box_prompt_detail;
  const at::Tensor lab = labels.dim() == 4 ? labels[0] : labels;
  std::vector<SliceBox> out;
  for (std::int64_t v : positive_labels(lab)) {
    const at::Tensor m = lab == v;
    const at::Tensor zs = m.flatten(1).any(1).nonzero().flatten();
    const std::int64_t z = zs[(zs.numel() - 1) / 2].item<std::int64_t>();
    out.push_back(box_of_mask(v, z, m[z]));
  }
  return out;
}

}  // namespace segflow::models
