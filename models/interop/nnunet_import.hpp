#pragma once
// nnU-Net in: an nnU-Net v2 results folder (what models/interop/nnunet_export.hpp writes, or
// nnU-Net itself trained) read back into segflow's terms.

#include <filesystem>

#include "messages/status.hpp"

namespace segflow::models {

/// nnU-Net in (`segflow import --from nnunet RESULTS_DIR/fold_K --out DIR`): the job config
/// (YAML) that plans.json's configuration translates to (the inverse of the table above:
/// CTNormalization -> normalize_ct, ZScoreNormalization -> zscore, NoNormalization -> none;
/// a PlainConvUNet whose features double per stage up to a cap, one conv count for all
/// stages; overlap and blending from plans.json's segflow section, else nnU-Net's 0.5 and
/// Gaussian) with the network_weights of fold_K/checkpoint_final.pth in it. A 2d
/// configuration becomes a 2D plain_unet whose resample takes z from the plans'
/// original_median_spacing_after_transp (nnU-Net keeps each case's z; segflow cannot). Writes
/// DIR/job.yaml, DIR/model.pt (a segflow checkpoint: `segflow infer --checkpoint`) and
/// DIR/weights.sfta (segflow names: `model.weights` for fine-tuning) through a temporary
/// folder; DIR must not exist. not_found naming a missing plans.json, dataset.json or
/// checkpoint; invalid_argument naming the field segflow cannot build. Returns DIR/model.pt.
Result<std::filesystem::path> import_nnunet(const std::filesystem::path& fold_dir,
                                            const std::filesystem::path& out);

}  // namespace segflow::models
