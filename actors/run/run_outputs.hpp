#pragma once
// What a run leaves for people to look at, one sink of the run's event bus each:
//
//  - metrics.jsonl: one JSON object per event, flushed per line (the record the other
//    outputs and `segflow ctl status` are rebuilt from).
//  - TensorBoard event files (tb/events.out.tfevents.<time>.<host>.<pid>): the TFRecord
//    framing (length, masked CRC-32C, payload, masked CRC-32C) around hand-encoded
//    tensorflow.Event protos holding simple_value scalars. No protobuf dependency; the
//    encoding is the handful of fields TensorBoard reads (wall_time, step, file_version,
//    summary.value{tag, simple_value}).
//  - progress.svg: loss, validation Dice, learning rate and epoch time against the epoch,
//    redrawn after every epoch (nnU-Net's progress.png, as a vector image any browser shows).
//
// Each is a TrainObserver driven from the trainer's thread; only metrics.jsonl is thread-safe.

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "actors/run/event_bus.hpp"
#include "messages/file_util.hpp"
#include "messages/status.hpp"
#include "models/training/trainer.hpp"

namespace segflow::actors {

/// Writes metrics.jsonl: one JSON object per line with "type" step|epoch|validation|
/// checkpoint|case_failure|data_event|early_stop, flushed per line. A sink of the run's event bus.
class JsonlMetricsObserver : public RunSink {
 public:
  explicit JsonlMetricsObserver(const std::filesystem::path& file, std::int64_t log_every = 10);
  ~JsonlMetricsObserver() override;
  /// {"type": "run", "device", "amp", "amp_setting", "amp_reason", "threads", "torch",
  /// "resumed_from", "epoch"}: how this attempt of the run trains (one per start or resume).
  void on_run_start(const models::Trainer& trainer, const std::string& resumed_from);
  void on_step(const models::StepInfo& i) override;
  void on_epoch_end(const models::EpochInfo& i) override;
  void on_validation(const models::ValidationInfo& i) override;
  void on_checkpoint(const std::filesystem::path& p, const std::string& kind) override;
  void on_case_failure(const pipeline::CaseFailure& f) override;
  /// {"type": "early_stop", "epoch", "metric", "mode", "value", "best", "best_epoch",
  /// "patience", "min_delta", "validations_without_improvement", "reason"}; nothing for a
  /// stop an earlier attempt already recorded (info.earlier).
  void on_early_stop(const models::EarlyStopInfo& i) override;
  /// {"type": "data_event", "kind", "source", "message", "case_id", "epoch", "time_ns"}
  void on_data_event(const Event& e) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// CRC-32C (Castagnoli), as TFRecord uses it.
std::uint32_t crc32c(const void* data, std::size_t n);

/// Appends scalar summaries to one TensorBoard event file.
class TensorBoardWriter {
 public:
  /// Creates `dir` and a new event file in it (writes the file_version event).
  explicit TensorBoardWriter(const std::filesystem::path& dir);
  bool ok() const { return static_cast<bool>(out_); }
  const std::filesystem::path& file() const { return file_; }
  void scalar(const std::string& tag, std::int64_t step, double value);
  void flush() { out_.flush(); }

 private:
  void write_record(const std::string& payload);
  std::filesystem::path file_;
  std::ofstream out_;
};

/// Scalars to TensorBoard: train/loss, train/lr, train/step_ms, train/data_wait_ms (every
/// log_every steps), epoch/loss, epoch/samples_per_s, epoch/seconds, epoch/data_wait_s,
/// val/mean_dice, val/dice_class_<k> (and val/dice_<name> for named classes, e.g.
/// val/dice_spleen), and memory/gpu_peak_mb when `gpu_peak_mb` is given.
class TensorBoardObserver : public models::TrainObserver {
 public:
  TensorBoardObserver(const std::filesystem::path& dir, std::int64_t log_every,
                      std::function<double()> gpu_peak_mb = {});
  void on_step(const models::StepInfo& i) override;
  void on_epoch_end(const models::EpochInfo& i) override;
  void on_validation(const models::ValidationInfo& i) override;

 private:
  TensorBoardWriter w_;
  std::int64_t every_;
  std::int64_t last_step_ = 0;
  std::function<double()> gpu_peak_mb_;
};

/// What a resumed run drops from the outputs the interrupted run left in its folder, so that
/// nothing is counted twice: step records past `at.step` (train/*, memory/*), epoch,
/// validation, early_stop and data-path event records of epoch `at.epoch` on (those epochs run again;
/// data-path events without an epoch are kept), and a record torn by
/// the crash. Rewrites metrics.jsonl and every TensorBoard event file under run_dir/tb
/// (temp file + rename; files with nothing to drop are left untouched). Returns the number
/// of records dropped.
Result<std::int64_t> trim_run_outputs(const std::filesystem::path& run_dir, const models::TrainState& at);

/// trim_run_outputs for a run resumed at `at`, with the outcome logged (a failure to trim is
/// a warning: training goes on, the files keep the duplicates).
void trim_for_resume(const std::filesystem::path& run_dir, const models::TrainState& at);

/// The (tag, step) of every scalar in a TensorBoard event file written by TensorBoardWriter,
/// in file order; stops at the first torn or corrupt record.
std::vector<std::pair<std::string, std::int64_t>> read_scalar_steps(const std::filesystem::path& event_file);

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
