#pragma once
// Out-of-fold predictions: at the end of a training run, the validation cases predicted with
// the final model (last.pt; sliding window with the run's validation settings, each case
// written on its own grid) into <run>/validation/<case id>.nii.gz and scored against their
// labels with segflow eval's metrics: <run>/validation/summary.json (evaluation_json: per
// case and class Dice, IoU, HD95, ASSD, NSD, volumes; class means) and scores.csv. With
// validation.save_probabilities also each case's class probabilities on the same grid
// (<case id>_probabilities.nii.gz, inference's writer), which `segflow select` averages.
// `segflow cv` (models/evidence/cross_validation.hpp) pools the folds' summaries.
// Not an actor: it runs in the job's thread after fit() returns.

#include <filesystem>

#include "messages/status.hpp"
#include "models/training/job_config.hpp"
#include "models/training/trainer.hpp"
#include "pipeline/split.hpp"

namespace segflow::actors {

/// Writes and scores the predictions of split.val with <run_dir>/last.pt on the trainer's
/// device. Nothing to do (ok) when validation.save_predictions is off, there is no
/// validation case, or the model is box-prompted (segflow infer takes no boxes yet). Errors: no last.pt, or
/// no case could be predicted or scored; a case that fails is listed in summary.json's "failed" and the
/// others are kept. Written to a temporary folder and renamed, so a run folder never holds half a
/// validation/.
Status write_validation_predictions(const models::JobConfig& cfg, const pipeline::Split& split,
                                    const std::filesystem::path& run_dir, const models::Trainer& trainer);

}  // namespace segflow::actors
