#pragma once
// A training run's folder and its outputs, owned in one place for every way a job runs (one
// device, rank 0 of a data-parallel run, a daemon job):
//   <runs_dir>/<name>-s<seed>-<hash>/   config.json, split.json, metrics.jsonl, tb/,
//                                        progress.svg, last.pt, best.pt
// and one event bus (actors/run/event_bus.hpp) that fans the trainer's events, and the data
// path's that its collector publishes there, out to one sink per output plus the caller's own
// observer (the daemon's PUB socket, a test, the CLI's progress lines).
// Not thread-safe: the trainer that owns the run posts to it from its own thread.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>

#include "actors/run/event_bus.hpp"
#include "actors/run/run_outputs.hpp"
#include "messages/status.hpp"
#include "models/training/job_config.hpp"
#include "models/training/trainer.hpp"
#include "pipeline/split.hpp"

namespace segflow::actors {

/// How to run a job: where its run folder goes, what it resumes from, which rank it is.
struct RunOptions {
  std::optional<std::filesystem::path> resume;   ///< checkpoint to resume from
  bool resume_last = false;                      ///< resume from the run folder's last.pt if present
  std::filesystem::path plugin_dir;              ///< extra stages (shared libraries); empty = none
  std::optional<std::filesystem::path> run_dir;  ///< override the deterministic run folder
  std::int64_t rank = 0;                         ///< data-parallel rank (this trainer's shard)
  std::int64_t world_size = 1;
  /// Where the data path's collector publishes its events (a run's event bus:
  /// RunFolder::data_events()); null: nowhere.
  std::shared_ptr<EventSink> data_events;
};

class RunFolder {
 public:
  /// Where the run goes and what it resumes from: `opts.run_dir`, else the folder of the
  /// checkpoint to resume (`opts.resume`), else runs_dir/run_name(cfg); with
  /// `opts.resume_last` that folder's last.pt when there is one. Touches nothing on disk.
  RunFolder(const models::JobConfig& cfg, const RunOptions& opts);
  ~RunFolder();
  RunFolder(const RunFolder&) = delete;
  RunFolder& operator=(const RunFolder&) = delete;

  /// Creates the folder, writes config.json (the resolved config) and split.json; when
  /// resuming, loads the checkpoint into `trainer` (an error naming it when it cannot be
  /// read) and drops the records the interrupted run wrote past it (also when resume_last
  /// found no checkpoint: an attempt that died before its first one); then opens the sinks.
  /// Events posted to events() reach metrics.jsonl, TensorBoard, progress.svg and `user`;
  /// data-path events (data_events()) reach metrics.jsonl and `user` when it is a RunSink.
  Status open(const models::JobConfig& cfg, models::Trainer& trainer, const pipeline::Split& split,
              models::TrainObserver& user);

  const std::filesystem::path& dir() const { return dir_; }
  /// The checkpoint the run resumes from (what every data-parallel rank loads), if any.
  const std::optional<std::filesystem::path>& resume() const { return resume_; }
  /// The event bus (its sinks are added by open()).
  models::TrainObserver& events() { return bus_; }
  /// The collector sink of the bus (valid from construction): pass it to the data path
  /// (RunOptions::data_events) so that its events reach the run's outputs.
  std::shared_ptr<EventSink> data_events() const { return bus_.collector_sink(); }

 private:
  std::filesystem::path dir_;
  std::optional<std::filesystem::path> resume_;
  bool start_over_ = false;
  std::unique_ptr<JsonlMetricsObserver> metrics_;
  std::unique_ptr<TensorBoardObserver> tensorboard_;
  std::unique_ptr<ProgressPlotObserver> plot_;
  EventBus bus_;
};

}  // namespace segflow::actors
