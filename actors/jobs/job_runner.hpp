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

#include "actors/run/run_folder.hpp"
#include "messages/sample.hpp"
#include "messages/status.hpp"
#include "models/training/job_config.hpp"
#include "models/training/trainer.hpp"
#include "pipeline/batch_source.hpp"
#include "pipeline/io/dataset.hpp"
#include "pipeline/pipeline_spec.hpp"
#include "pipeline/split.hpp"

namespace segflow::actors {

/// Makes the dataset of `cfg` when data.root does not exist and data.synth is set.
Status ensure_dataset(const models::JobConfig& cfg);

/// A job set up and ready to train: what run_training and `segflow bench` share.
struct PreparedJob {
  pipeline::Split split;
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

}  // namespace segflow::actors
