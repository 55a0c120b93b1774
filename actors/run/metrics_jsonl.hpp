#pragma once
// The run's metrics.jsonl sink: one JSON object per event, flushed per line, the record the
// other outputs and `segflow ctl status` are rebuilt from. Thread-safe.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "actors/run/event_bus.hpp"
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

/// What a resumed run drops from its metrics.jsonl `file` (temp file + rename; untouched when
/// nothing is dropped): step records past `at.step`, epoch, validation, early_stop and
/// data-path event records of epoch `at.epoch` on (data-path events without an epoch are
/// kept), and a line torn by the crash. The number of records dropped (0 without the file).
Result<std::int64_t> trim_metrics_jsonl(const std::filesystem::path& file, const models::TrainState& at);

}  // namespace segflow::actors
