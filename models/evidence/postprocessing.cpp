#include "models/evidence/postprocessing.hpp"

#include <torch/torch.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <limits>
#include <random>
#include <set>

#include "messages/file_util.hpp"
#include "models/evidence/evaluation.hpp"
#include "models/training/run_layout.hpp"
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
    SEGFLOW_RETURN_IF_ERROR(apply_postprocessing_step(cand, step, st.plan.connectivity));
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
  const RunLayout layout(run);
  const fs::path file = layout.validation_summary();
  SEGFLOW_ASSIGN_OR_RETURN(
      nlohmann::json s,
      read_json_object(file,
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
    k.pred_path = layout.validation_prediction(k.id);
    SEGFLOW_ASSIGN_OR_RETURN(k.pred, pipeline::read_image(k.pred_path));
    if (k.pred.voxels.dim() != 4 || k.pred.voxels.size(0) != 1)
      return invalid_argument(k.pred_path.string() + ": expected a single-channel label map");
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

}  // namespace segflow::models
