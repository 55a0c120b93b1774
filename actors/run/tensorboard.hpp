#pragma once
// The run's TensorBoard sink: event files (tb/events.out.tfevents.<time>.<host>.<pid>) in the
// TFRecord framing (length, masked CRC-32C, payload, masked CRC-32C) around hand-encoded
// tensorflow.Event protos holding simple_value scalars. No protobuf dependency; the encoding is
// the handful of fields TensorBoard reads (wall_time, step, file_version, summary.value{tag,
// simple_value}). A TrainObserver driven from the trainer's thread.

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

/// What a resumed run drops from its TensorBoard event files under `tb_dir` (temp file +
/// rename; files with nothing to drop are left untouched): train/* and memory/* records past
/// `at.step`, epoch/* and val/* records of epoch `at.epoch` on, and a record torn by the
/// crash. The number of records dropped (0 without the folder).
Result<std::int64_t> trim_tensorboard(const std::filesystem::path& tb_dir, const models::TrainState& at);

/// The (tag, step) of every scalar in a TensorBoard event file written by TensorBoardWriter,
/// in file order; stops at the first torn or corrupt record.
std::vector<std::pair<std::string, std::int64_t>> read_scalar_steps(const std::filesystem::path& event_file);

}  // namespace segflow::actors
