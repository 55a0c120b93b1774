#pragma once
// A postprocessing plan (postprocessing.json, what `segflow postprocess determine` chose on
// the out-of-fold predictions: models/evidence/postprocessing.hpp) read back and applied to
// label maps: by `segflow postprocess apply`, by `segflow infer` with a model package, and by
// determine itself while it tries each step.

#include <nlohmann/json_fwd.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "messages/status.hpp"

namespace segflow::models {

/// The figure steps must raise (higher is better for each).
enum class PostprocessMetric { dice, iou, nsd };
const char* to_string(PostprocessMetric m);
/// "dice", "iou" or "nsd"; an error listing them for anything else.
Result<PostprocessMetric> postprocess_metric_from_string(const std::string& text);

enum class PostprocessKind {
  keep_largest,  ///< keep the largest connected component
  remove_small,  ///< remove components of fewer than min_voxels voxels
};
const char* to_string(PostprocessKind k);

/// One step tried.
struct PostprocessStep {
  PostprocessKind kind = PostprocessKind::keep_largest;
  std::int64_t label = 0;                ///< the class; 0 = all foreground together
  std::int64_t min_voxels = 0;           ///< remove_small: the best size of the grid
  bool kept = false;                     ///< the step raised the metric
  double before = 0, after = 0;          ///< the metric without / with this step
  std::map<std::int64_t, double> tried;  ///< remove_small: the metric per size tried
};

/// What determine found; also what apply reads back from postprocessing.json.
struct PostprocessPlan {
  PostprocessMetric metric = PostprocessMetric::dice;
  int connectivity = 26;  ///< 26 (3D; 8 for a 2D map): every touching voxel joins
  std::vector<std::int64_t> classes;
  std::vector<std::filesystem::path> runs;
  std::int64_t cases = 0;
  double before = 0, after = 0;            ///< the metric without / with the kept steps
  double dice_before = 0, dice_after = 0;  ///< mean Dice likewise
  std::vector<PostprocessStep> steps;      ///< every step tried, in order
};

/// {"metric", "connectivity", "classes", "runs", "cases", "before", "after", "dice_before",
/// "dice_after", "steps": [{"kind", "class" ("foreground" or the label), "kept", "before",
/// "after"[, "min_voxels", "tried": {"10": ...}]}]}.
nlohmann::json postprocessing_json(const PostprocessPlan& plan);
/// Reads postprocessing.json; errors name the file and the field.
Result<PostprocessPlan> read_postprocessing(const std::filesystem::path& file);

/// Applies one step in place to a (Z, Y, X) label map: the components it removes become
/// background. Errors as pipeline::label_components.
Status apply_postprocessing_step(at::Tensor& labels, const PostprocessStep& step, int connectivity);

/// The label map ((Z, Y, X), (1, Z, Y, X) or (Y, X), integer) with the plan's kept steps
/// applied, in its dtype. Errors as pipeline::label_components.
Result<at::Tensor> apply_postprocessing(const at::Tensor& labels, const PostprocessPlan& plan);
/// Reads a label file, applies the plan and writes `out` (any writable format) with the
/// input's geometry and dtype.
Status apply_postprocessing_file(const std::filesystem::path& in, const std::filesystem::path& out,
                                 const PostprocessPlan& plan);

}  // namespace segflow::models
