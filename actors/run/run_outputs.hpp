#pragma once
// What a run leaves for people to look at, one sink of the run's event bus per file (each in
// its own header): metrics.jsonl (metrics_jsonl.hpp), TensorBoard event files under tb/
// (tensorboard.hpp) and progress.svg (progress_plot.hpp). Their paths are RunLayout's
// (models/training/run_layout.hpp). This header adds what a resumed run does to them.

#include <cstdint>
#include <filesystem>

#include "actors/run/metrics_jsonl.hpp"
#include "actors/run/progress_plot.hpp"
#include "actors/run/tensorboard.hpp"
#include "messages/status.hpp"
#include "models/training/trainer.hpp"

namespace segflow::actors {

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

}  // namespace segflow::actors
