#pragma once
// `segflow eval`: predicted label maps scored against ground truth, one file pair or two
// folders / datasets matched by case id. Reads with the pipeline's readers, maps a
// prediction on another grid onto the ground truth's grid (nearest, through patient
// coordinates), scores with models/evidence/eval_metrics.hpp, and reports as JSON, CSV or text.

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "messages/status.hpp"
#include "models/evidence/eval_metrics.hpp"

namespace segflow::models {

/// What to score.
struct EvaluateOptions {
  std::filesystem::path pred;  ///< label file, DICOM case folder, folder of label files or dataset
  std::filesystem::path gt;    ///< the same kinds; a dataset root uses labelsTr/ (MSD) or gts/ (MedSAM)
  double tolerance_mm = 2.0;   ///< NSD tolerance, mm, >= 0
  std::vector<std::int64_t> classes;  ///< label values to score; empty = every value > 0 seen
  /// Called with one line per note (a partial grid overlap, a label value only one side
  /// has, a case that failed); may be empty.
  std::function<void(const std::string&)> note;
  /// Explicit (case id, prediction, ground truth) pairs scored instead of `pred` / `gt`
  /// (a run's validation cases, whose labels are wherever the dataset keeps them).
  struct Pair {
    std::string id;
    std::filesystem::path pred, gt;
  };
  std::vector<Pair> pairs;
};

/// One scored case.
struct CaseEvaluation {
  std::string id;
  std::filesystem::path pred, gt;
  bool resampled = false;            ///< the prediction was mapped from another grid
  std::vector<ClassScores> classes;  ///< one per EvaluationReport::classes, same order
};

/// Means of one class over the cases where it is in the prediction or the ground truth.
struct ClassMean {
  std::int64_t label = 0;
  std::int64_t cases = 0;   ///< cases with the class in either map
  std::int64_t missed = 0;  ///< of those, cases with the class in one map only (HD95, ASSD inf)
  ClassScores mean;         ///< each field the mean of its finite values (NaN when none)
};

/// Everything `segflow eval` reports.
struct EvaluationReport {
  double tolerance_mm = 2.0;
  std::vector<std::int64_t> classes;                        ///< scored label values, ascending
  std::map<std::int64_t, std::string> names;                ///< label value -> name, from a dataset.json
  std::vector<CaseEvaluation> cases;                        ///< in case id order
  std::vector<ClassMean> means;                             ///< one per class
  std::vector<std::string> pred_without_gt;                 ///< prediction case ids with no ground truth
  std::vector<std::string> gt_without_pred;                 ///< ground-truth case ids with no prediction
  std::vector<std::pair<std::string, std::string>> failed;  ///< (case id, error) of cases not scored
};

/// Scores. Errors: a missing path, a single pair that cannot be read or does not overlap,
/// no case id in common between two folders; a folder case that fails goes to `failed`.
Result<EvaluationReport> evaluate(const EvaluateOptions& options);

/// {"cases": [{"case", "pred", "gt", "classes": {"1": {dice, iou, hd95, assd, nsd,
/// volume_pred_ml, volume_gt_ml[, name]}}}], "mean": {"1": {..., cases, missed}}, ...}; NaN
/// and infinity as null.
nlohmann::json evaluation_json(const EvaluationReport& report);
/// One row per case and class: case,class,name,dice,iou,hd95,assd,nsd,volume_pred_ml,
/// volume_gt_ml (NaN empty, infinity "inf").
std::string evaluation_csv(const EvaluationReport& report);
/// A readable table: a line per case and class, then the means.
std::string evaluation_text(const EvaluationReport& report);

}  // namespace segflow::models
