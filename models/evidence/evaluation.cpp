#include "models/evidence/evaluation.hpp"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <sstream>

#include "messages/geometry.hpp"
#include "pipeline/io/case_files.hpp"
#include "pipeline/io/dataset.hpp"
#include "pipeline/io/dicom.hpp"
#include "pipeline/io/image_io.hpp"
#include "pipeline/io/nifti.hpp"
#include "pipeline/transforms/spatial.hpp"

namespace segflow::models {

namespace fs = std::filesystem;
using pipeline::case_id_of;
using pipeline::is_hidden;

namespace {

constexpr std::int64_t kMaxLabelValue = 65535;
constexpr std::int64_t kMaxDistinctLabels = 1000;

/// A label map from a file, or from a DICOM case folder (its SEG on the series' grid, or a
/// NIfTI label in it).
Result<pipeline::Image> read_label_source(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return not_found(path.string() + ": no such file or folder");
  if (!fs::is_directory(path, ec)) return pipeline::read_image(path);
  std::vector<pipeline::SkippedFile> skipped;
  SEGFLOW_ASSIGN_OR_RETURN(auto series, pipeline::scan_dicom_folder(path, &skipped));
  const pipeline::DicomSeriesInfo *seg = nullptr, *image = nullptr;
  for (const auto& s : series) {
    if (s.modality == "SEG" && !s.files.empty())
      seg = &s;
    else if (!image && !s.files.empty())
      image = &s;
  }
  if (seg) {
    if (!image) return pipeline::read_dicom_seg(seg->files.front());
    SEGFLOW_ASSIGN_OR_RETURN(pipeline::Image ref, pipeline::read_dicom_series(image->files));
    return pipeline::read_dicom_seg(seg->files.front(), ref);
  }
  for (const auto& e : fs::directory_iterator(path, ec))
    if (e.is_regular_file() && !is_hidden(e.path()) && pipeline::is_nifti_path(e.path()))
      return pipeline::read_image(e.path());
  return not_found(path.string() +
                   ": expected a DICOM SEG or a NIfTI label map in the folder, found neither");
}

/// The label map of an image as (Z, Y, X) int32, and its distinct values; errors when the
/// image is not a label map (several channels, fractions, negative or huge values, too
/// many distinct values).
Result<std::pair<at::Tensor, std::vector<std::int64_t>>> label_map_of(const pipeline::Image& img,
                                                                      const fs::path& path) {
  const std::string where = path.string();
  const at::Tensor v = img.voxels.scalar_type() == at::kBool ? img.voxels.to(at::kByte) : img.voxels;
  if (!v.defined() || v.dim() != 4 || v.numel() == 0)
    return invalid_argument(where + ": expected a label map (1, Z, Y, X), got no voxels");
  if (v.size(0) != 1)
    return invalid_argument(where + ": expected a single-channel label map, got " +
                            std::to_string(v.size(0)) + " channels");
  if (at::isFloatingType(v.scalar_type())) {
    at::Tensor frac = (v - v.round()).abs();
    if (frac.max().item<double>() > 0) {
      const double example = v.flatten().index({frac.flatten().argmax()}).item<double>();
      return invalid_argument(where + ": expected a label map (integer values), got " +
                              pipeline::dtype_name(v) + " values with fractions such as " +
                              std::to_string(example));
    }
  }
  const double lo = v.min().item<double>(), hi = v.max().item<double>();
  if (lo < 0 || hi > static_cast<double>(kMaxLabelValue))
    return invalid_argument(where + ": expected label values in 0.." + std::to_string(kMaxLabelValue) +
                            ", got values in [" + std::to_string(static_cast<long long>(lo)) + ", " +
                            std::to_string(static_cast<long long>(hi)) + "] (an intensity image?)");
  at::Tensor lab = v[0].to(at::kInt).contiguous();
  // Which values occur: one pass over the int32 copy (no 8-byte copy for bincount).
  std::vector<std::uint8_t> seen(static_cast<std::size_t>(hi) + 1, 0);
  const std::int32_t* d = lab.data_ptr<std::int32_t>();
  for (std::int64_t i = 0, n = lab.numel(); i < n; ++i) seen[static_cast<std::size_t>(d[i])] = 1;
  std::vector<std::int64_t> values;
  for (std::size_t k = 0; k < seen.size(); ++k)
    if (seen[k]) values.push_back(static_cast<std::int64_t>(k));
  if (static_cast<std::int64_t>(values.size()) > kMaxDistinctLabels)
    return invalid_argument(where + ": expected a label map with at most " +
                            std::to_string(kMaxDistinctLabels) + " distinct values, got " +
                            std::to_string(values.size()) + " (an intensity image?)");
  return std::make_pair(lab, values);
}

std::string describe_grid(const pipeline::Image& img) {
  const auto s = img.size();
  return "size [" + std::to_string(s[0]) + ", " + std::to_string(s[1]) + ", " + std::to_string(s[2]) + "] " +
         describe(img.geometry);
}

/// Label names of the ground truth, index = label value: the dataset.json `labels` of its
/// folder or of up to two folders above it (pipeline::label_names_from_json: MSD {"1": "liver"}
/// or nnU-Net v2 {"liver": 1}); else the segment labels of a DICOM SEG ground truth, or of a
/// folder of DICOM case folders (pipeline::dataset_label_names).
std::map<std::int64_t, std::string> find_label_names(const fs::path& gt) {
  const auto by_value = [](const std::vector<std::string>& names) {
    std::map<std::int64_t, std::string> m;
    for (std::size_t v = 0; v < names.size(); ++v)
      if (!names[v].empty()) m[static_cast<std::int64_t>(v)] = names[v];
    return m;
  };
  std::error_code ec;
  fs::path dir = fs::is_directory(gt, ec) ? gt : gt.parent_path();
  for (int up = 0; up < 3 && !dir.empty(); ++up, dir = dir.parent_path()) {
    const fs::path file = dir / "dataset.json";
    if (fs::is_regular_file(file, ec)) {
      std::ifstream in(file);
      const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
      if (!j.is_discarded() && j.is_object() && j.contains("labels")) {
        auto names = by_value(pipeline::label_names_from_json(j["labels"]));
        if (!names.empty()) return names;
      }
    }
    if (dir == dir.parent_path()) break;
  }
  if (fs::is_directory(gt, ec)) return by_value(pipeline::dataset_label_names(gt));
  if (pipeline::is_dicom_seg_file(gt))
    if (auto segments = pipeline::read_dicom_seg_segments(gt); segments.is_ok())
      return by_value(pipeline::segment_class_names(*segments));
  return {};
}

/// The cases of a folder or dataset: (id, path), sorted by id.
Result<std::vector<std::pair<std::string, fs::path>>> list_cases(const fs::path& root,
                                                                 std::vector<std::string>& notes) {
  std::error_code ec;
  fs::path dir = root;
  if (fs::is_directory(root / "labelsTr", ec))
    dir = root / "labelsTr";
  else if (fs::is_directory(root / "gts", ec))
    dir = root / "gts";
  std::map<std::string, fs::path> found;
  std::vector<fs::path> entries;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (!is_hidden(e.path())) entries.push_back(e.path());
  if (ec) return io_error(dir.string() + ": cannot list the folder: " + ec.message());
  std::sort(entries.begin(), entries.end());
  for (const auto& p : entries) {
    std::string id;
    if (fs::is_directory(p, ec)) {
      if (p.filename() == "imagesTr" || p.filename() == "imagesTs" || p.filename() == "imgs") continue;
      id = p.filename().string();
    } else {
      if (pipeline::is_side_file(p)) continue;
      id = case_id_of(p);
    }
    if (!found.emplace(id, p).second)
      notes.push_back(p.string() + ": case " + id + " already read from " + found[id].string() + "; ignored");
  }
  return std::vector<std::pair<std::string, fs::path>>(found.begin(), found.end());
}

/// Matches prediction cases to ground-truth cases by id; an id that differs only by the
/// nnU-Net channel suffix "_0000" matches too.
std::vector<std::pair<std::size_t, std::size_t>> match_cases(
    const std::vector<std::pair<std::string, fs::path>>& pred,
    const std::vector<std::pair<std::string, fs::path>>& gt, std::vector<std::string>& pred_only,
    std::vector<std::string>& gt_only) {
  const auto strip = [](const std::string& id) { return pipeline::strip_channel_zero(id); };
  std::map<std::string, std::size_t> gt_exact, gt_stripped;
  for (std::size_t i = 0; i < gt.size(); ++i) {
    gt_exact[gt[i].first] = i;
    gt_stripped.emplace(strip(gt[i].first), i);
  }
  std::vector<bool> gt_used(gt.size(), false);
  std::vector<std::pair<std::size_t, std::size_t>> pairs;
  for (std::size_t i = 0; i < pred.size(); ++i) {
    const std::string& id = pred[i].first;
    std::optional<std::size_t> hit;
    if (auto it = gt_exact.find(id); it != gt_exact.end() && !gt_used[it->second])
      hit = it->second;
    else if (auto it2 = gt_exact.find(strip(id)); it2 != gt_exact.end() && !gt_used[it2->second])
      hit = it2->second;
    else if (auto it3 = gt_stripped.find(strip(id)); it3 != gt_stripped.end() && !gt_used[it3->second])
      hit = it3->second;
    if (hit) {
      gt_used[*hit] = true;
      pairs.emplace_back(i, *hit);
    } else {
      pred_only.push_back(id);
    }
  }
  for (std::size_t i = 0; i < gt.size(); ++i)
    if (!gt_used[i]) gt_only.push_back(gt[i].first);
  std::sort(pairs.begin(), pairs.end(),
            [&](const auto& a, const auto& b) { return gt[a.second].first < gt[b.second].first; });
  return pairs;
}

/// Scores for a class absent from both maps of a case.
ClassScores both_empty(std::int64_t label) {
  ClassScores s;
  s.label = label;
  s.dice = s.iou = 1.0;
  s.hd95 = s.assd = s.nsd = kNaN;
  return s;
}

/// One case: read, check, map the prediction onto the ground-truth grid, score.
Result<CaseEvaluation> evaluate_case(const std::string& id, const fs::path& pred_path,
                                     const fs::path& gt_path, const EvaluateOptions& o,
                                     std::set<std::int64_t>& pred_values, std::set<std::int64_t>& gt_values,
                                     std::vector<std::string>& notes) {
  SEGFLOW_ASSIGN_OR_RETURN(pipeline::Image gt_img, read_label_source(gt_path));
  SEGFLOW_ASSIGN_OR_RETURN(pipeline::Image pred_img, read_label_source(pred_path));
  SEGFLOW_ASSIGN_OR_RETURN(auto gt_lab, label_map_of(gt_img, gt_path));
  SEGFLOW_ASSIGN_OR_RETURN(auto pred_lab, label_map_of(pred_img, pred_path));
  CaseEvaluation c;
  c.id = id;
  c.pred = pred_path;
  c.gt = gt_path;
  at::Tensor gt_map = gt_lab.first, pred_map = pred_lab.first;
  const bool same_grid =
      pred_img.size() == gt_img.size() && geometry_close(pred_img.geometry, gt_img.geometry, 1e-3);
  if (!same_grid) {
    // Label + 1 so that ground-truth voxels outside the prediction's grid come out 0.
    at::Tensor mapped = pipeline::resample_to_grid((pred_map + 1).unsqueeze(0), pred_img.geometry,
                                                   gt_img.geometry, gt_img.size())[0];
    const std::int64_t outside = (mapped == 0).sum().item<std::int64_t>();
    if (outside == mapped.numel())
      return invalid_argument(pred_path.string() + ": the prediction's grid (" + describe_grid(pred_img) +
                              ") does not overlap the ground truth's grid (" + gt_path.string() + ": " +
                              describe_grid(gt_img) + ")");
    if (outside > 0)
      notes.push_back("case " + id + ": " + std::to_string(outside) + " of " +
                      std::to_string(mapped.numel()) +
                      " ground-truth voxels lie outside the prediction's grid and count as background");
    // Predicted foreground that falls outside the ground truth's grid is not scored: say so.
    at::Tensor inside = pipeline::resample_to_grid(
        torch::ones({1, gt_map.size(0), gt_map.size(1), gt_map.size(2)}, at::kByte), gt_img.geometry,
        pred_img.geometry, pred_img.size())[0];
    const std::int64_t lost = ((pred_map > 0) & (inside == 0)).sum().item<std::int64_t>();
    if (lost > 0)
      notes.push_back("case " + id + ": " + std::to_string(lost) +
                      " predicted foreground voxels lie outside the ground truth's grid and are not scored");
    pred_map = (mapped - 1).clamp_min(0).to(at::kInt).contiguous();
    c.resampled = true;
  }
  std::set<std::int64_t> labels(o.classes.begin(), o.classes.end());
  for (auto v : gt_lab.second)
    if (v > 0) gt_values.insert(v);
  for (auto v : pred_lab.second)
    if (v > 0) pred_values.insert(v);
  if (o.classes.empty()) {
    for (auto v : gt_lab.second)
      if (v > 0) labels.insert(v);
    for (auto v : pred_lab.second)
      if (v > 0) labels.insert(v);
  }
  const auto sp = gt_img.geometry.spacing;
  EvalMetricOptions mo;
  mo.tolerance_mm = o.tolerance_mm;
  std::vector<std::int64_t> lv(labels.begin(), labels.end());
  if (gt_map.size(0) == 1)  // a 2D image: in-plane neighbours and distances only
    c.classes = score_label_maps(pred_map[0], gt_map[0], lv, {sp[0], sp[1]}, mo);
  else
    c.classes = score_label_maps(pred_map, gt_map, lv, {sp[0], sp[1], sp[2]}, mo);
  return c;
}

nlohmann::json number(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

nlohmann::json scores_json(const ClassScores& s) {
  return {{"dice", number(s.dice)},
          {"iou", number(s.iou)},
          {"hd95", number(s.hd95)},
          {"assd", number(s.assd)},
          {"nsd", number(s.nsd)},
          {"volume_pred_ml", number(s.volume_pred_ml)},
          {"volume_gt_ml", number(s.volume_gt_ml)}};
}

std::string csv_number(double v) {
  if (std::isnan(v)) return "";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::ostringstream os;
  os.precision(9);
  os << v;
  return os.str();
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char ch : s) q += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return q + "\"";
}

}  // namespace

namespace {

void note(const EvaluateOptions& o, const std::string& line) {
  if (o.note) o.note(line);
}

Status check_options(const EvaluateOptions& o) {
  if (!(o.tolerance_mm >= 0) || !std::isfinite(o.tolerance_mm))
    return invalid_argument("--tolerance-mm: expected a number >= 0, got " + std::to_string(o.tolerance_mm));
  for (auto c : o.classes)
    if (c < 1 || c > kMaxLabelValue)
      return invalid_argument("--classes: expected label values in 1.." + std::to_string(kMaxLabelValue) +
                              ", got " + std::to_string(c));
  std::error_code ec;
  for (const auto& pair : o.pairs)
    for (const auto* p : {&pair.pred, &pair.gt})
      if (!fs::exists(*p, ec))
        return not_found(p->string() + ": no such file or folder (case " + pair.id + ")");
  if (!o.pairs.empty()) return Status::ok();
  for (const auto* p : {&o.pred, &o.gt})
    if (!fs::exists(*p, ec)) return not_found(p->string() + ": no such file or folder");
  return Status::ok();
}

/// Label values seen, and notes not yet passed on, while scoring cases.
struct Seen {
  std::set<std::int64_t> pred_values, gt_values;
  std::vector<std::string> notes;
};

/// Two folders of cases: the cases matched by id are scored (a case that fails is listed
/// in r.failed), the unmatched ones listed.
Status score_collections(const EvaluateOptions& o, EvaluationReport& r, Seen& seen) {
  SEGFLOW_ASSIGN_OR_RETURN(auto gts, list_cases(o.gt, seen.notes));
  SEGFLOW_ASSIGN_OR_RETURN(auto preds, list_cases(o.pred, seen.notes));
  auto pairs = match_cases(preds, gts, r.pred_without_gt, r.gt_without_pred);
  for (const auto& id : r.pred_without_gt)
    note(o, "prediction " + id + " has no ground truth in " + o.gt.string());
  for (const auto& id : r.gt_without_pred)
    note(o, "ground truth " + id + " has no prediction in " + o.pred.string());
  if (pairs.empty())
    return not_found(o.pred.string() + ": no prediction matches a ground-truth case of " + o.gt.string() +
                     " (" + std::to_string(preds.size()) + " predictions, " + std::to_string(gts.size()) +
                     " ground-truth cases; ids are file names without extensions)");
  for (const auto& [pi, gi] : pairs) {
    for (const auto& n : seen.notes) note(o, n);
    seen.notes.clear();
    const std::string& id = gts[gi].first;
    auto c =
        evaluate_case(id, preds[pi].second, gts[gi].second, o, seen.pred_values, seen.gt_values, seen.notes);
    if (!c.is_ok()) {
      r.failed.emplace_back(id, c.status().message());
      note(o, "case " + id + " not scored: " + c.status().message());
      continue;
    }
    r.cases.push_back(std::move(*c));
  }
  return Status::ok();
}

/// The same classes in every case: a class a case has in neither map scores "both empty".
void align_classes(EvaluationReport& r) {
  std::set<std::int64_t> scored;
  for (const auto& c : r.cases)
    for (const auto& s : c.classes) scored.insert(s.label);
  r.classes.assign(scored.begin(), scored.end());
  for (auto& c : r.cases) {
    std::vector<ClassScores> full;
    for (auto l : r.classes) {
      auto it = std::find_if(c.classes.begin(), c.classes.end(),
                             [l](const ClassScores& s) { return s.label == l; });
      full.push_back(it != c.classes.end() ? *it : both_empty(l));
    }
    c.classes = std::move(full);
  }
}

/// The mean of class r.classes[k] over the cases that have it in either map (finite values
/// only); `missed` counts those where one map lacks it.
ClassMean class_mean(const EvaluationReport& r, std::size_t k) {
  ClassMean m;
  m.label = r.classes[k];
  m.mean.label = m.label;
  double sums[7] = {0, 0, 0, 0, 0, 0, 0};
  std::int64_t counts[7] = {0, 0, 0, 0, 0, 0, 0};
  for (const auto& c : r.cases) {
    const ClassScores& s = c.classes[k];
    if (s.voxels_pred == 0 && s.voxels_gt == 0) continue;
    ++m.cases;
    if (s.voxels_pred == 0 || s.voxels_gt == 0) ++m.missed;
    const double v[7] = {s.dice, s.iou, s.hd95, s.assd, s.nsd, s.volume_pred_ml, s.volume_gt_ml};
    for (int f = 0; f < 7; ++f)
      if (std::isfinite(v[f])) sums[f] += v[f], ++counts[f];
  }
  double* out[7] = {&m.mean.dice,           &m.mean.iou,         &m.mean.hd95, &m.mean.assd, &m.mean.nsd,
                    &m.mean.volume_pred_ml, &m.mean.volume_gt_ml};
  for (int f = 0; f < 7; ++f) *out[f] = counts[f] ? sums[f] / static_cast<double>(counts[f]) : kNaN;
  return m;
}

}  // namespace

Result<EvaluationReport> evaluate(const EvaluateOptions& o) {
  try {
    SEGFLOW_RETURN_IF_ERROR(check_options(o));
    std::error_code ec;
    EvaluationReport r;
    r.tolerance_mm = o.tolerance_mm;
    if (o.pairs.empty()) r.names = find_label_names(o.gt);
    Seen seen;
    if (!o.pairs.empty()) {
      for (const auto& pair : o.pairs) {
        auto c = evaluate_case(pair.id, pair.pred, pair.gt, o, seen.pred_values, seen.gt_values, seen.notes);
        if (c.is_ok()) {
          r.cases.push_back(std::move(*c));
        } else {
          r.failed.emplace_back(pair.id, c.status().message());
          note(o, "case " + pair.id + " not scored: " + c.status().message());
        }
      }
      r.names = find_label_names(o.pairs.front().gt);
    }
    const bool gt_collection =
        o.pairs.empty() && fs::is_directory(o.gt, ec) && !pipeline::is_dicom_case_folder(o.gt);
    const bool pred_collection = fs::is_directory(o.pred, ec) && !pipeline::is_dicom_case_folder(o.pred);
    if (o.pairs.empty() && gt_collection != pred_collection)
      return invalid_argument(std::string("--pred ") + o.pred.string() + " is " +
                              (pred_collection ? "a folder of cases" : "one case") + " but --gt " +
                              o.gt.string() + " is " + (gt_collection ? "a folder of cases" : "one case") +
                              ": expected two files or two folders");
    if (!o.pairs.empty()) {
      // scored above
    } else if (!gt_collection) {
      fs::path g = o.gt;
      if (g.filename().empty()) g = g.parent_path();  // "case_000/"
      std::string id = fs::is_directory(g, ec) ? g.filename().string() : case_id_of(g);
      SEGFLOW_ASSIGN_OR_RETURN(
          CaseEvaluation c, evaluate_case(id, o.pred, o.gt, o, seen.pred_values, seen.gt_values, seen.notes));
      r.cases.push_back(std::move(c));
    } else {
      SEGFLOW_RETURN_IF_ERROR(score_collections(o, r, seen));
    }
    for (const auto& n : seen.notes) note(o, n);
    if (r.cases.empty())
      return invalid_argument("no case could be scored; first error: " +
                              (r.failed.empty() ? std::string("none") : r.failed.front().second));
    align_classes(r);
    for (auto v : seen.pred_values)
      if (!seen.gt_values.count(v))
        note(o, "label " + std::to_string(v) + " is predicted but in no ground truth (scored with Dice 0)");
    for (auto v : o.classes)
      if (!seen.gt_values.count(v) && !seen.pred_values.count(v))
        note(o, "label " + std::to_string(v) + " from --classes is in no prediction and no ground truth");
    for (std::size_t k = 0; k < r.classes.size(); ++k) r.means.push_back(class_mean(r, k));
    return r;
  } catch (const c10::Error& e) {
    return internal_error(std::string("eval: ") + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return internal_error(std::string("eval: ") + e.what());
  }
}

nlohmann::json evaluation_json(const EvaluationReport& r) {
  nlohmann::json cases = nlohmann::json::array();
  for (const auto& c : r.cases) {
    nlohmann::json classes = nlohmann::json::object();
    for (const auto& s : c.classes) {
      nlohmann::json j = scores_json(s);
      if (auto it = r.names.find(s.label); it != r.names.end()) j["name"] = it->second;
      classes[std::to_string(s.label)] = j;
    }
    cases.push_back({{"case", c.id},
                     {"pred", c.pred.string()},
                     {"gt", c.gt.string()},
                     {"resampled", c.resampled},
                     {"classes", classes}});
  }
  nlohmann::json mean = nlohmann::json::object();
  for (const auto& m : r.means) {
    nlohmann::json j = scores_json(m.mean);
    j["cases"] = m.cases;
    j["missed"] = m.missed;
    if (auto it = r.names.find(m.label); it != r.names.end()) j["name"] = it->second;
    mean[std::to_string(m.label)] = j;
  }
  nlohmann::json failed = nlohmann::json::array();
  for (const auto& [id, err] : r.failed) failed.push_back({{"case", id}, {"error", err}});
  return {{"cases", cases},
          {"mean", mean},
          {"tolerance_mm", r.tolerance_mm},
          {"unmatched", {{"predictions", r.pred_without_gt}, {"ground_truth", r.gt_without_pred}}},
          {"failed", failed}};
}

std::string evaluation_csv(const EvaluationReport& r) {
  std::string out = "case,class,name,dice,iou,hd95,assd,nsd,volume_pred_ml,volume_gt_ml\n";
  for (const auto& c : r.cases)
    for (const auto& s : c.classes) {
      auto it = r.names.find(s.label);
      out += csv_field(c.id) + "," + std::to_string(s.label) + "," +
             csv_field(it != r.names.end() ? it->second : "");
      for (double v : {s.dice, s.iou, s.hd95, s.assd, s.nsd, s.volume_pred_ml, s.volume_gt_ml})
        out.append(",").append(csv_number(v));
      out += "\n";
    }
  return out;
}

std::string evaluation_text(const EvaluationReport& r) {
  std::ostringstream os;
  char buf[256];
  const auto name_of = [&](std::int64_t l) {
    auto it = r.names.find(l);
    return std::to_string(l) + (it != r.names.end() ? " " + it->second : std::string());
  };
  const auto fmt = [](double v) {
    char b[32];
    if (std::isnan(v)) return std::string("-");
    if (std::isinf(v)) return std::string("inf");
    std::snprintf(b, sizeof b, "%.3f", v);
    return std::string(b);
  };
  std::snprintf(buf, sizeof buf, "%-20s %-16s %7s %7s %8s %8s %7s %10s %10s\n", "case", "class", "dice",
                "iou", "hd95_mm", "assd_mm", "nsd", "pred_ml", "gt_ml");
  os << buf;
  const auto row = [&](const std::string& id, std::int64_t label, const ClassScores& s) {
    std::snprintf(buf, sizeof buf, "%-20s %-16s %7s %7s %8s %8s %7s %10s %10s\n", id.c_str(),
                  name_of(label).c_str(), fmt(s.dice).c_str(), fmt(s.iou).c_str(), fmt(s.hd95).c_str(),
                  fmt(s.assd).c_str(), fmt(s.nsd).c_str(), fmt(s.volume_pred_ml).c_str(),
                  fmt(s.volume_gt_ml).c_str());
    os << buf;
  };
  for (const auto& c : r.cases)
    for (const auto& s : c.classes) row(c.id, s.label, s);
  for (const auto& m : r.means) row("mean (n=" + std::to_string(m.cases) + ")", m.label, m.mean);
  os << "NSD at " << fmt(r.tolerance_mm) << " mm; means over the cases that have the class in either map, "
     << "of the finite values\n";
  return os.str();
}

}  // namespace segflow::models
