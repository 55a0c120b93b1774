#pragma once
// `segflow postprocess`: postprocessing chosen on evidence, as nnU-Net's
// determine_postprocessing. On the out-of-fold predictions of a set of runs (each run's
// validation/<case>.nii.gz, scored against the ground truth its validation/summary.json
// names) it tries, in order and each on top of the steps kept before it:
//   1. keep the largest connected component of all foreground together;
//   2. per class, keep the largest component of that class;
//   3. per class, remove the components smaller than N voxels (N from a grid; the best N);
// and keeps a step only when it raises the chosen metric (the mean over classes of the
// per-class mean over cases, as segflow eval's means: cases with the class in neither map
// do not count). Removed voxels become background. Candidates are scored with
// models::evaluate on label maps written to a scratch folder (only the cases a step
// changes), so the figures are segflow eval's.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "messages/status.hpp"
#include "models/inference/postprocessing_plan.hpp"

namespace segflow::models {

struct DetermineOptions {
  std::vector<std::filesystem::path> runs;  ///< run folders with validation/ (one per fold)
  PostprocessMetric metric = PostprocessMetric::dice;
  std::vector<std::int64_t> min_voxels_grid = {10, 50, 100, 500, 1000};  ///< empty: skip step 3
  std::filesystem::path scratch;  ///< candidate label maps; empty = a temporary folder, removed
  std::function<void(const std::string&)> note;  ///< progress lines; may be empty
};

/// Tries the steps on the runs' out-of-fold predictions. Errors name the run and file: no
/// validation/summary.json, a prediction missing, a case in two runs, a case not scored.
Result<PostprocessPlan> determine_postprocessing(const DetermineOptions& options);

}  // namespace segflow::models
