#pragma once
// A model package, read: the chosen checkpoints of a cross-validation (one per fold, of one
// configuration or of several ensembled) in one self-contained folder, written by `segflow
// package` (models/evidence/packaging.hpp), that `segflow infer --model`, `segflow ctl infer
// --model` and the daemon's auto_infer take:
//
//   MODEL_DIR/model.json            the manifest (below)
//   MODEL_DIR/members/<i>-<run>/    one folder per member: the checkpoint (last.pt or
//                                   best.pt, copied) and the run's config.json
//   MODEL_DIR/postprocessing.json   when given (segflow postprocess determine's plan)
//
// model.json: {"format": "segflow-model-1", "created", "classes": [{label, name}],
// "spatial_dims", "in_channels", "family", "tta", "overlap" (null: each member's own
// validation.overlap), "checkpoint" (last | best), "members": [{checkpoint, config, run,
// source, fold, configuration, family, spatial_dims, overlap}], "postprocessing" (file name or null, with
// "postprocessing_summary": its before/after figures), "cv": [the cross-validation figures
// the members were chosen on: per summary its runs, per class and mean Dice/HD95/NSD with
// intervals], "selection" (selection.json's content, when packaged from one), "files":
// {relative path: sha256 hex} for every other file of the package}.
//
// Reading checks every file's sha256 against the manifest.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "messages/status.hpp"
#include "models/inference/postprocessing_plan.hpp"
#include "models/inference/tta.hpp"

namespace segflow::models {

inline constexpr const char* kModelPackageFormat = "segflow-model-1";

/// One checkpoint of the package.
struct PackageMember {
  std::filesystem::path checkpoint;  ///< relative to the package: members/<i>-<run>/last.pt
  std::filesystem::path config;      ///< relative: members/<i>-<run>/config.json
  std::string run;                   ///< the run folder's name
  std::filesystem::path source;      ///< the checkpoint it was copied from
  std::int64_t fold = -1;            ///< data.fold of its config (-1: not a fold)
  std::string configuration;         ///< the job config's name
  std::string family;                ///< model name (unet, plain_unet, ...)
  double overlap = 0.25;             ///< its validation.overlap
};

struct ModelPackage {
  std::filesystem::path dir;
  std::vector<PackageMember> members;
  std::vector<std::string> class_names;  ///< labels 0..K-1
  int spatial_dims = 3;                  ///< the first member's (2D and 3D members may mix)
  std::int64_t in_channels = 1;
  std::string family;
  TtaMode tta = TtaMode::none;
  double overlap = -1.0;   ///< < 0: each member's own validation.overlap
  std::string checkpoint;  ///< last | best
  std::optional<PostprocessPlan> postprocessing;
  nlohmann::json manifest;  ///< model.json as read or written
};

/// Reads MODEL_DIR/model.json; with `verify`, every file's sha256 is checked ("MODEL_DIR/
/// members/0-x/last.pt: sha256 differs from model.json's (the file changed after packaging)").
Result<ModelPackage> read_model_package(const std::filesystem::path& dir, bool verify = true);

}  // namespace segflow::models
