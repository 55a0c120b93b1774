#pragma once
// The run's progress.svg sink: loss, validation Dice, learning rate and epoch time against the
// epoch, redrawn after every epoch (nnU-Net's progress.png, as a vector image any browser
// shows). A TrainObserver driven from the trainer's thread.

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "models/training/trainer.hpp"

namespace segflow::actors {

/// progress.svg, rewritten (temp + rename) after every epoch and validation.
class ProgressPlotObserver : public models::TrainObserver {
 public:
  explicit ProgressPlotObserver(std::filesystem::path file) : file_(std::move(file)) {}
  void on_epoch_end(const models::EpochInfo& i) override;
  void on_validation(const models::ValidationInfo& i) override;
  /// Loads the epochs and validations already in a metrics.jsonl (a resumed run's history).
  void replay(const std::filesystem::path& metrics_jsonl);
  /// The SVG text of the current curves (also what gets written).
  std::string render() const;

 private:
  void write() const;
  std::filesystem::path file_;
  std::vector<double> epoch_, loss_, lr_, seconds_;
  std::vector<double> val_epoch_, val_dice_;
};

}  // namespace segflow::actors
