#pragma once
// A run folder's layout: the path of every file a training run writes and its readers
// (cross-validation, postprocessing, selection, packaging, resume, the daemon) look for, named
// in one place. docs/reference/run-folder.md describes the files.
//
//   RUN/config.json              the resolved job config
//   RUN/last.pt, RUN/best.pt     checkpoints (models/training/checkpoint.hpp)
//   RUN/metrics.jsonl            every event, one JSON object per line
//   RUN/tb/                      TensorBoard event files
//   RUN/progress.svg             the curves
//   RUN/weights_report.json      what model.weights loaded (when set)
//   RUN/plan/                    the plan a `segflow train DATASET` run trains
//   RUN/validation/              out-of-fold predictions: <case>.nii.gz,
//                                <case>_probabilities.nii.gz, summary.json

#include <filesystem>
#include <string>
#include <utility>

#include "models/training/checkpoint.hpp"

namespace segflow::models {

/// The paths of one run folder. A value type: cheap to make from a run folder's path.
class RunLayout {
 public:
  explicit RunLayout(std::filesystem::path dir) : dir_(std::move(dir)) {}

  /// The run folder itself.
  const std::filesystem::path& dir() const { return dir_; }
  /// config.json: the resolved job config the run trains.
  std::filesystem::path config() const { return dir_ / "config.json"; }
  /// last.pt: the checkpoint written at every epoch's end.
  std::filesystem::path last_checkpoint() const { return dir_ / kLastCheckpoint; }
  /// best.pt: the checkpoint of the best validation.
  std::filesystem::path best_checkpoint() const { return dir_ / kBestCheckpoint; }
  /// "<which>.pt" for which = last | best.
  std::filesystem::path checkpoint(const std::string& which) const { return dir_ / (which + ".pt"); }
  /// metrics.jsonl: one JSON object per event.
  std::filesystem::path metrics() const { return dir_ / "metrics.jsonl"; }
  /// tb/: TensorBoard event files.
  std::filesystem::path tensorboard() const { return dir_ / "tb"; }
  /// progress.svg: loss, Dice, learning rate and epoch time against the epoch.
  std::filesystem::path progress_plot() const { return dir_ / "progress.svg"; }
  /// weights_report.json: what model.weights loaded.
  std::filesystem::path weights_report() const { return dir_ / "weights_report.json"; }
  /// plan/: the plan's YAML, plans.json and fingerprint.json a `segflow train DATASET` run trains.
  std::filesystem::path plan() const { return dir_ / "plan"; }
  /// validation/: the out-of-fold predictions of the run's validation cases.
  std::filesystem::path validation() const { return dir_ / "validation"; }
  /// validation/summary.json: the scored validation cases.
  std::filesystem::path validation_summary() const { return validation() / "summary.json"; }
  /// validation/<case>.nii.gz: a validation case's label map.
  std::filesystem::path validation_prediction(const std::string& case_id) const {
    return validation() / (case_id + ".nii.gz");
  }
  /// validation/<case>_probabilities.nii.gz: its class probabilities (when saved).
  std::filesystem::path validation_probabilities(const std::string& case_id) const {
    return validation() / (case_id + "_probabilities.nii.gz");
  }

 private:
  std::filesystem::path dir_;
};

}  // namespace segflow::models
