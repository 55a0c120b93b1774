#pragma once
// `segflow package`: the chosen checkpoints of a cross-validation (one per fold, of one
// configuration or of several ensembled) written as one self-contained model folder, the
// layout models/inference/model_package.hpp describes and reads. The folder is written as
// "<MODEL_DIR>.partial-<pid>" beside it and renamed; an existing MODEL_DIR is never
// overwritten.

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "messages/status.hpp"
#include "models/inference/model_package.hpp"

namespace segflow::models {

/// What `segflow package` packs.
struct PackageOptions {
  std::vector<std::filesystem::path> runs;       ///< run folders (one per fold)
  std::vector<std::filesystem::path> cv;         ///< segflow cv's cv_summary.json files: their runs
  std::filesystem::path selection;               ///< segflow select's selection.json: its runs
  std::filesystem::path postprocessing;          ///< postprocessing.json; empty = none
  std::filesystem::path out;                     ///< MODEL_DIR; must not exist
  std::string checkpoint = "last";               ///< last (what the out-of-fold figures used) | best
  TtaMode tta = TtaMode::none;                   ///< none (as the out-of-fold figures) | mirror
  std::function<void(const std::string&)> note;  ///< progress lines; may be empty
};

/// Checks the members (every checkpoint there and loadable, one class count and channel
/// count; the postprocessing for those classes) and writes the package. Errors name
/// the run, file or field; nothing is left behind on failure.
Result<ModelPackage> write_model_package(const PackageOptions& options);

}  // namespace segflow::models
