#include "models/evidence/postprocessing.hpp"

#include <torch/torch.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <limits>
#include <random>
#include <set>

#include "models/evidence/evaluation.hpp"
#include "pipeline/connected_components.hpp"
#include "pipeline/io/image_io.hpp"
#include "pipeline/io/nifti.hpp"

namespace segflow::models {

namespace fs = std::filesystem;

namespace {

constexpr double kPpNaN = std::numeric_limits<double>::quiet_NaN();

/// One out-of-fold case: its prediction as the kept steps left it, and its scores.
struct OofCase {
  std::string id;
  fs::path gt, pred_path;
  pipeline::Image pred;
  std::vector<ClassScores> scores;  ///< one per PostprocessPlan::classes
};

/// What a step would make of every case: the changed label maps (undefined: unchanged),
/// every case's scores and the metric over them.
struct PpTrial {
  std::vector<at::Tensor> maps;
  std::vector<std::vector<ClassScores>> scores;
  double value = kPpNaN;
};

struct DetermineState {
  const DetermineOptions& options;
  PostprocessPlan& plan;
  std::vector<OofCase> cases;
  fs::path scratch;
  int trials = 0;
};

Result<nlohmann::json> read_pp_json(const fs::path& file, const std::string& what) {
  std::ifstream in(file);
  if (!in) return not_found(file.string() + ": " + what);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return corrupt_data(file.string() + ": not a JSON object");
  return j;
}

/// The metric's field of one class's scores.
double field_of(const ClassScores& s, PostprocessMetric m) {
  switch (m) {
    case PostprocessMetric::iou:
      return s.iou;
    case PostprocessMetric::nsd:
      return s.nsd;
    case PostprocessMetric::dice:
      break;
  }
  return s.dice;
}

/// Per class the mean of the finite values over the cases with the class in either map
/// (segflow eval's means), then the mean over the classes that have one.
double metric_of(const std::vector<std::vector<ClassScores>>& scores, std::size_t classes,
                 PostprocessMetric m) {
  double total = 0;
  std::int64_t n_classes = 0;
  for (std::size_t k = 0; k < classes; ++k) {
    double sum = 0;
    std::int64_t n = 0;
    for (const auto& c : scores) {
      const ClassScores& s = c[k];
      if (s.voxels_pred == 0 && s.voxels_gt == 0) continue;
      const double v = field_of(s, m);
      if (std::isfinite(v)) sum += v, ++n;
    }
    if (n) total += sum / static_cast<double>(n), ++n_classes;
  }
  return n_classes ? total / static_cast<double>(n_classes) : kPpNaN;
}

std::vector<std::vector<ClassScores>> scores_of(const std::vector<OofCase>& cases) {
  std::vector<std::vector<ClassScores>> out;
  for (const auto& c : cases) out.push_back(c.scores);
  return out;
}

/// Applies one step in place to a (Z, Y, X) label map.
Status apply_step(at::Tensor& labels, const PostprocessStep& s, int connectivity) {
  const at::Tensor mask = s.label == 0 ? labels.gt(0) : labels.eq(s.label);
  auto keep = s.kind == PostprocessKind::keep_largest
                  ? pipeline::keep_largest_component(mask, connectivity)
                  : pipeline::remove_small_components(mask, s.min_voxels, connectivity);
  if (!keep.is_ok()) return keep.status();
  labels.masked_fill_(mask.logical_and(keep->logical_not()), 0);
  return Status::ok();
}

/// Scores `pairs` (label maps written to the scratch folder) on the plan's classes; the
/// scores by case id.
Result<std::map<std::string, std::vector<ClassScores>>> score_pairs(
    const DetermineState& st, std::vector<EvaluateOptions::Pair> pairs) {
  std::map<std::string, std::vector<ClassScores>> out;
  if (pairs.empty()) return out;
  EvaluateOptions eo;
  eo.pairs = std::move(pairs);
  eo.classes = st.plan.classes;
  SEGFLOW_ASSIGN_OR_RETURN(EvaluationReport r, evaluate(eo));
  if (!r.failed.empty())
    return invalid_argument("postprocess: case " + r.failed.front().first +
                            " not scored: " + r.failed.front().second);
  if (r.classes != st.plan.classes)
    return internal_error("postprocess: evaluate scored other classes than asked");
  for (auto& c : r.cases) out[c.id] = std::move(c.classes);
  return out;
}

/// What `step` makes of every case (on top of the steps kept so far), scored.
Result<PpTrial> try_step(DetermineState& st, const PostprocessStep& step) {
  PpTrial t;
  const fs::path dir = st.scratch / ("trial" + std::to_string(st.trials++));
  std::vector<EvaluateOptions::Pair> pairs;
  for (const auto& c : st.cases) {
    at::Tensor cand = c.pred.voxels[0].clone();
    SEGFLOW_RETURN_IF_ERROR(apply_step(cand, step, st.plan.connectivity));
    if (torch::equal(cand, c.pred.voxels[0])) {
      t.maps.emplace_back();
      continue;
    }
    t.maps.push_back(cand.unsqueeze(0));
    if (pairs.empty()) fs::create_directories(dir);
    pipeline::Image img = c.pred;
    img.voxels = t.maps.back();
    pairs.push_back({c.id, dir / (c.id + ".nii.gz"), c.gt});
    SEGFLOW_RETURN_IF_ERROR(pipeline::write_nifti(pairs.back().pred, img));
  }
  SEGFLOW_ASSIGN_OR_RETURN(auto scored, score_pairs(st, pairs));
  for (const auto& c : st.cases) t.scores.push_back(scored.count(c.id) ? scored[c.id] : c.scores);
  t.value = metric_of(t.scores, st.plan.classes.size(), st.plan.metric);
  std::error_code ec;
  fs::remove_all(dir, ec);
  return t;
}

void adopt(DetermineState& st, PpTrial& t) {
  for (std::size_t i = 0; i < st.cases.size(); ++i) {
    if (t.maps[i].defined()) st.cases[i].pred.voxels = t.maps[i];
    st.cases[i].scores = std::move(t.scores[i]);
  }
}

void note_step(const DetermineState& st, const PostprocessStep& s) {
  if (!st.options.note) return;
  std::string what = std::string(to_string(s.kind)) + " " +
                     (s.label == 0 ? std::string("foreground") : "class " + std::to_string(s.label));
  if (s.kind == PostprocessKind::remove_small) what += " < " + std::to_string(s.min_voxels) + " voxels";
  st.options.note(what + ": " + to_string(st.plan.metric) + " " + std::to_string(s.before) + " -> " +
                  std::to_string(s.after) + (s.kept ? " (kept)" : " (not kept)"));
}

/// Tries a keep-largest step; keeps it when it raises the metric.
Status try_keep_largest(DetermineState& st, std::int64_t label, double& current) {
  PostprocessStep s;
  s.kind = PostprocessKind::keep_largest;
  s.label = label;
  SEGFLOW_ASSIGN_OR_RETURN(PpTrial t, try_step(st, s));
  s.before = current;
  s.after = t.value;
  s.kept = t.value > current;
  if (s.kept) adopt(st, t), current = t.value;
  note_step(st, s);
  st.plan.steps.push_back(s);
  return Status::ok();
}

/// Tries every size of the grid for one class; keeps the best when it raises the metric.
Status try_remove_small(DetermineState& st, std::int64_t label, double& current) {
  PostprocessStep best;
  best.kind = PostprocessKind::remove_small;
  best.label = label;
  best.before = current;
  best.after = kPpNaN;
  PpTrial best_trial;
  for (std::int64_t n : st.options.min_voxels_grid) {
    PostprocessStep s = best;
    s.min_voxels = n;
    SEGFLOW_ASSIGN_OR_RETURN(PpTrial t, try_step(st, s));
    best.tried[n] = t.value;
    if (std::isnan(best.after) || t.value > best.after)
      best.after = t.value, best.min_voxels = n, best_trial = std::move(t);
  }
  best.kept = best.after > current;
  if (best.kept) adopt(st, best_trial), current = best.after;
  note_step(st, best);
  st.plan.steps.push_back(best);
  return Status::ok();
}

}  // namespace

namespace {

/// The cases of one run's validation/summary.json with their predictions read.
Status load_run(const fs::path& run, std::set<std::string>& seen, std::vector<OofCase>& out) {
  const fs::path file = run / "validation" / "summary.json";
  SEGFLOW_ASSIGN_OR_RETURN(
      nlohmann::json s,
      read_pp_json(file,
                   "no out-of-fold predictions (train with validation.save_predictions: true; an "
                   "unfinished run has none)"));
  if (!s.contains("cases") || !s["cases"].is_array() || s["cases"].empty())
    return corrupt_data(file.string() + ": cases: expected scored cases, got none");
  for (std::size_t i = 0; i < s["cases"].size(); ++i) {
    const nlohmann::json& c = s["cases"][i];
    const std::string where = file.string() + ": cases[" + std::to_string(i) + "]";
    if (!c.contains("case") || !c["case"].is_string() || !c.contains("gt") || !c["gt"].is_string())
      return corrupt_data(where + ": expected \"case\" and \"gt\" strings");
    OofCase k;
    k.id = c["case"].get<std::string>();
    k.gt = c["gt"].get<std::string>();
    if (!seen.insert(k.id).second)
      return invalid_argument("postprocess: case " + k.id + " is in two runs' validation (" + run.string() +
                              " and another): expected one run per fold");
    k.pred_path = run / "validation" / (k.id + ".nii.gz");
    SEGFLOW_ASSIGN_OR_RETURN(k.pred, pipeline::read_image(k.pred_path));
    if (k.pred.voxels.dim() != 4 || k.pred.voxels.size(0) != 1)
      return invalid_argument((run / "validation" / (k.id + ".nii.gz")).string() +
                              ": expected a single-channel label map");
    out.push_back(std::move(k));
  }
  return Status::ok();
}

/// The predictions as they are: their classes and scores.
Status score_baseline(DetermineState& st) {
  EvaluateOptions eo;
  for (const auto& c : st.cases) eo.pairs.push_back({c.id, c.pred_path, c.gt});
  SEGFLOW_ASSIGN_OR_RETURN(EvaluationReport r, evaluate(eo));
  if (!r.failed.empty())
    return invalid_argument("postprocess: case " + r.failed.front().first +
                            " not scored: " + r.failed.front().second);
  st.plan.classes = r.classes;
  std::map<std::string, std::vector<ClassScores>> by_id;
  for (auto& c : r.cases) by_id[c.id] = std::move(c.classes);
  for (auto& c : st.cases) c.scores = by_id[c.id];
  return Status::ok();
}

/// A scratch folder removed when it goes out of scope, unless the caller named one.
struct Scratch {
  fs::path path;
  bool owned = false;
  explicit Scratch(const fs::path& given) {
    if (!given.empty()) {
      path = given;
      return;
    }
    std::random_device rd;
    path = fs::temp_directory_path() /
           ("segflow-postprocess-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
    owned = true;
  }
  ~Scratch() {
    std::error_code ec;
    if (owned) fs::remove_all(path, ec);
  }
};

double dice_of(const std::vector<OofCase>& cases, std::size_t classes) {
  return metric_of(scores_of(cases), classes, PostprocessMetric::dice);
}

}  // namespace

const char* to_string(PostprocessMetric m) {
  switch (m) {
    case PostprocessMetric::dice:
      return "dice";
    case PostprocessMetric::iou:
      return "iou";
    case PostprocessMetric::nsd:
      return "nsd";
  }
  return "?";
}

Result<PostprocessMetric> postprocess_metric_from_string(const std::string& text) {
  for (auto m : {PostprocessMetric::dice, PostprocessMetric::iou, PostprocessMetric::nsd})
    if (text == to_string(m)) return m;
  return invalid_argument("metric: expected dice, iou or nsd, got '" + text + "'");
}

const char* to_string(PostprocessKind k) {
  return k == PostprocessKind::keep_largest ? "keep_largest" : "remove_small";
}

Result<PostprocessPlan> determine_postprocessing(const DetermineOptions& o) {
  if (o.runs.empty()) return invalid_argument("postprocess: expected run folders, got none");
  for (auto n : o.min_voxels_grid)
    if (n < 1)
      return invalid_argument("postprocess: min_voxels_grid: expected sizes >= 1, got " + std::to_string(n));
  PostprocessPlan plan;
  plan.metric = o.metric;
  plan.runs = o.runs;
  DetermineState st{o, plan, {}, {}, 0};
  std::set<std::string> seen;
  for (const auto& run : o.runs) SEGFLOW_RETURN_IF_ERROR(load_run(run, seen, st.cases));
  plan.cases = static_cast<std::int64_t>(st.cases.size());
  Scratch scratch(o.scratch);
  st.scratch = scratch.path;
  SEGFLOW_RETURN_IF_ERROR(score_baseline(st));
  const std::size_t nc = plan.classes.size();
  double current = metric_of(scores_of(st.cases), nc, plan.metric);
  plan.before = current;
  plan.dice_before = dice_of(st.cases, nc);
  if (nc > 1) SEGFLOW_RETURN_IF_ERROR(try_keep_largest(st, 0, current));
  for (auto label : plan.classes) SEGFLOW_RETURN_IF_ERROR(try_keep_largest(st, label, current));
  if (!o.min_voxels_grid.empty())
    for (auto label : plan.classes) SEGFLOW_RETURN_IF_ERROR(try_remove_small(st, label, current));
  plan.after = current;
  plan.dice_after = dice_of(st.cases, nc);
  return plan;
}

namespace {

nlohmann::json pp_number(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

double pp_number_of(const nlohmann::json& j) { return j.is_number() ? j.get<double>() : kPpNaN; }

/// One step of postprocessing.json; `where` is "FILE: steps[i]".
Result<PostprocessStep> read_step(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) return invalid_config(where + ": expected an object");
  PostprocessStep s;
  const std::string kind = j.value("kind", "");
  if (kind == "keep_largest")
    s.kind = PostprocessKind::keep_largest;
  else if (kind == "remove_small")
    s.kind = PostprocessKind::remove_small;
  else
    return invalid_config(where + ".kind: expected keep_largest or remove_small, got '" + kind + "'");
  const auto& c = j.contains("class") ? j["class"] : nlohmann::json();
  if (c.is_string() && c.get<std::string>() == "foreground")
    s.label = 0;
  else if (c.is_number_integer() && c.get<std::int64_t>() > 0)
    s.label = c.get<std::int64_t>();
  else
    return invalid_config(where + ".class: expected \"foreground\" or a label > 0, got " + c.dump());
  if (!j.contains("kept") || !j["kept"].is_boolean())
    return invalid_config(where + ".kept: expected true or false, got " +
                          (j.contains("kept") ? j["kept"].dump() : "nothing"));
  s.kept = j["kept"].get<bool>();
  if (s.kind == PostprocessKind::remove_small) {
    const auto& n = j.contains("min_voxels") ? j["min_voxels"] : nlohmann::json();
    if (!n.is_number_integer() || n.get<std::int64_t>() < 0)
      return invalid_config(where + ".min_voxels: expected an integer >= 0, got " + n.dump());
    s.min_voxels = n.get<std::int64_t>();
  }
  s.before = pp_number_of(j.value("before", nlohmann::json()));
  s.after = pp_number_of(j.value("after", nlohmann::json()));
  return s;
}

}  // namespace

nlohmann::json postprocessing_json(const PostprocessPlan& p) {
  nlohmann::json steps = nlohmann::json::array();
  for (const auto& s : p.steps) {
    nlohmann::json j = {{"kind", to_string(s.kind)},
                        {"class", s.label == 0 ? nlohmann::json("foreground") : nlohmann::json(s.label)},
                        {"kept", s.kept},
                        {"before", pp_number(s.before)},
                        {"after", pp_number(s.after)}};
    if (s.kind == PostprocessKind::remove_small) {
      j["min_voxels"] = s.min_voxels;
      nlohmann::json tried = nlohmann::json::object();
      for (const auto& [n, v] : s.tried) tried[std::to_string(n)] = pp_number(v);
      j["tried"] = tried;
    }
    steps.push_back(j);
  }
  nlohmann::json runs = nlohmann::json::array();
  for (const auto& r : p.runs) runs.push_back(r.string());
  return {{"metric", to_string(p.metric)},
          {"connectivity", p.connectivity},
          {"classes", p.classes},
          {"runs", runs},
          {"cases", p.cases},
          {"before", pp_number(p.before)},
          {"after", pp_number(p.after)},
          {"dice_before", pp_number(p.dice_before)},
          {"dice_after", pp_number(p.dice_after)},
          {"steps", steps}};
}

Result<PostprocessPlan> read_postprocessing(const fs::path& file) {
  SEGFLOW_ASSIGN_OR_RETURN(nlohmann::json j,
                           read_pp_json(file, "no such file (expected postprocessing.json)"));
  const std::string f = file.string();
  PostprocessPlan p;
  const nlohmann::json metric = j.contains("metric") ? j["metric"] : nlohmann::json("dice");
  auto m = postprocess_metric_from_string(metric.is_string() ? metric.get<std::string>() : metric.dump());
  if (!m.is_ok()) return invalid_config(f + ": " + m.status().message());
  p.metric = *m;
  const auto& conn = j.contains("connectivity") ? j["connectivity"] : nlohmann::json(26);
  if (!conn.is_number_integer() || (conn != 6 && conn != 18 && conn != 26))
    return invalid_config(f + ": connectivity: expected 6, 18 or 26, got " + conn.dump());
  p.connectivity = conn.get<int>();
  if (!j.contains("steps") || !j["steps"].is_array())
    return invalid_config(f + ": steps: expected a list of steps, got " +
                          (j.contains("steps") ? j["steps"].dump() : std::string("nothing")));
  for (std::size_t i = 0; i < j["steps"].size(); ++i) {
    SEGFLOW_ASSIGN_OR_RETURN(PostprocessStep s,
                             read_step(j["steps"][i], f + ": steps[" + std::to_string(i) + "]"));
    p.steps.push_back(s);
  }
  if (j.contains("classes") && j["classes"].is_array())
    for (const auto& c : j["classes"])
      if (c.is_number_integer()) p.classes.push_back(c.get<std::int64_t>());
  p.cases = j.value("cases", std::int64_t{0});
  p.before = pp_number_of(j.value("before", nlohmann::json()));
  p.after = pp_number_of(j.value("after", nlohmann::json()));
  p.dice_before = pp_number_of(j.value("dice_before", nlohmann::json()));
  p.dice_after = pp_number_of(j.value("dice_after", nlohmann::json()));
  return p;
}

Result<at::Tensor> apply_postprocessing(const at::Tensor& labels, const PostprocessPlan& plan) {
  at::Tensor v;
  if (labels.dim() == 2)
    v = labels.unsqueeze(0);
  else if (labels.dim() == 3)
    v = labels;
  else if (labels.dim() == 4 && labels.size(0) == 1)
    v = labels[0];
  else
    return invalid_argument("postprocess: label map: expected (Y, X), (Z, Y, X) or (1, Z, Y, X), got " +
                            std::to_string(labels.dim()) + " dimensions");
  v = v.clone();
  for (const auto& s : plan.steps)
    if (s.kept) SEGFLOW_RETURN_IF_ERROR(apply_step(v, s, plan.connectivity));
  return v.reshape(labels.sizes());
}

Status apply_postprocessing_file(const fs::path& in, const fs::path& out, const PostprocessPlan& plan) {
  SEGFLOW_ASSIGN_OR_RETURN(pipeline::Image img, pipeline::read_image(in));
  auto v = apply_postprocessing(img.voxels, plan);
  if (!v.is_ok()) return v.status().with_context(in.string());
  img.voxels = *v;
  return pipeline::write_image(out, img);
}

}  // namespace segflow::models
