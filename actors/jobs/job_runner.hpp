#pragma once
// One training job end to end, as `segflow train` and the daemon's job supervisor run it:
// data (synthesised on first use when the config says so), split, pipeline, data path
// (the CAF actor pipeline, or the synchronous baseline), trainer, run folder.
//
// Run folder (runs_dir/run_name(cfg)/): config.json (resolved), metrics.jsonl, log.txt,
// last.pt, best.pt. Re-running the same config resumes from last.pt when `resume_last`.

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/run/event_bus.hpp"
#include "messages/sample.hpp"
#include "messages/status.hpp"
#include "models/job_config.hpp"
#include "models/trainer.hpp"
#include "pipeline/batch_source.hpp"
#include "pipeline/io/dataset.hpp"
#include "pipeline/pipeline_spec.hpp"

namespace segflow::actors {

/// How to run a job.
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

/// The case ids of one cross-validation fold.
struct FoldIds {
  std::vector<std::string> train;
  std::vector<std::string> val;
};

/// The train/validation split of a dataset (deterministic for a seed).
struct Split {
  std::vector<pipeline::CaseEntry> train;
  std::vector<pipeline::CaseEntry> val;
  std::int64_t fold = -1;      ///< the cross-validation fold this is; -1 = a val_fraction split
  std::vector<FoldIds> folds;  ///< with fold >= 0: every fold of the table (splits.json)
};

/// nnU-Net's cross-validation table (its generate_crossval_split, sklearn's KFold with
/// shuffling): the ids sorted, shuffled by a Fisher-Yates pass seeded with `seed`, cut in
/// `folds` consecutive parts whose sizes differ by at most one (the first n % folds parts
/// one larger); fold k validates on part k (in sorted order) and trains on the others.
/// The parts partition the ids. Needs 2 <= folds <= ids.size() (invalid_argument otherwise).
Result<std::vector<FoldIds>> cross_validation_folds(std::vector<std::string> ids, std::int64_t folds,
                                                    std::uint64_t seed);

/// Without data.fold: holds out val_cases (or round(val_fraction * n), at least 1 when n > 1
/// and the fraction is > 0) chosen by a seeded shuffle of the case ids. With data.fold = k:
/// fold k of cross_validation_folds(ids, data.folds, seed), the whole table in `folds`;
/// an invalid_config error naming data.folds when there are fewer cases than folds.
Result<Split> make_split(const std::vector<pipeline::CaseEntry>& cases, const models::JobConfig& cfg);
/// make_split for a config whose folds fit the cases (what prepare_job has checked); with
/// too few cases for data.folds it returns an empty split.
Split split_cases(const std::vector<pipeline::CaseEntry>& cases, const models::JobConfig& cfg);
/// Writes the split to run_dir/split.json ({"train": [ids], "val": [ids]}, like one entry of
/// nnU-Net's splits_final.json, with "fold" and "folds" for a cross-validation fold), so that
/// other tools can train and score on the same cases; for a fold also run_dir/splits.json,
/// the whole table as nnU-Net's splits_final.json: [{"train": [...], "val": [...]}, ...].
Status write_split(const std::filesystem::path& run_dir, const Split& split);

/// Makes the dataset of `cfg` when data.root does not exist and data.synth is set.
Status ensure_dataset(const models::JobConfig& cfg);

/// A job set up and ready to train: what run_training and `segflow bench` share.
struct PreparedJob {
  Split split;
  std::unique_ptr<pipeline::Pipeline> pipeline;  ///< the sources point at it: keep it alive
  std::unique_ptr<models::Trainer> trainer;
  std::unique_ptr<pipeline::BatchSource> source;
  std::int64_t steps_per_epoch = 1;
  std::vector<Sample> validation;  ///< preprocessed validation samples
  ~PreparedJob();                  ///< the source goes before the pipeline
  PreparedJob() = default;
  PreparedJob(PreparedJob&&) = default;
};

/// Dataset (synthesised when needed), split, pipeline (with plugins), trainer on the
/// config's device, data path and validation samples. Skipped cases go to `observer`.
Result<PreparedJob> prepare_job(const models::JobConfig& cfg, const RunOptions& options,
                                models::TrainObserver& observer);

/// Runs the job to the end (or until observer.should_stop()). Returns the run folder.
Result<std::filesystem::path> run_training(const models::JobConfig& cfg, const RunOptions& options,
                                           models::TrainObserver& observer);

/// Writes metrics.jsonl: one JSON object per line with "type" step|epoch|validation|
/// checkpoint|case_failure|data_event, flushed per line. A sink of the run's event bus.
class JsonlMetricsObserver : public RunSink {
 public:
  explicit JsonlMetricsObserver(const std::filesystem::path& file, std::int64_t log_every = 10);
  ~JsonlMetricsObserver() override;
  void on_step(const models::StepInfo& i) override;
  void on_epoch_end(const models::EpochInfo& i) override;
  void on_validation(const models::ValidationInfo& i) override;
  void on_checkpoint(const std::filesystem::path& p, const std::string& kind) override;
  void on_case_failure(const pipeline::CaseFailure& f) override;
  /// {"type": "data_event", "kind", "source", "message", "case_id", "epoch", "time_ns"}
  void on_data_event(const Event& e) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace segflow::actors
