#pragma once
// One registration function per built-in stage file; register_builtin_stages()
// (pipeline/stage_registry.hpp) calls them all.

#include "messages/status.hpp"
#include "pipeline/fwd.hpp"

namespace segflow::pipeline {

Status register_load_stage(StageRegistry& r);                   ///< load
Status register_map_labels_stage(StageRegistry& r);             ///< map_labels
Status register_reorient_stage(StageRegistry& r);               ///< reorient
Status register_resample_stage(StageRegistry& r);               ///< resample
Status register_crop_foreground_stage(StageRegistry& r);        ///< crop_foreground
Status register_scale_intensity_range_stage(StageRegistry& r);  ///< scale_intensity_range
Status register_normalize_intensity_stage(StageRegistry& r);    ///< normalize_intensity
Status register_normalize_ct_stage(StageRegistry& r);           ///< normalize_ct
Status register_zscore_stage(StageRegistry& r);                 ///< zscore
Status register_clip_percentiles_stage(StageRegistry& r);       ///< clip_percentiles
Status register_fg_bg_indices_stage(StageRegistry& r);          ///< fg_bg_indices
Status register_rand_crop_pos_neg_stage(StageRegistry& r);      ///< rand_crop_pos_neg
Status register_rand_flip_stage(StageRegistry& r);              ///< rand_flip
Status register_rand_rotate90_stage(StageRegistry& r);          ///< rand_rotate90
Status register_rand_affine_stage(StageRegistry& r);            ///< rand_affine
/// rand_shift_intensity, rand_scale_intensity, rand_gamma, rand_gaussian_noise: four small
/// stages sharing one file (each is a few lines around one torch expression).
Status register_rand_intensity_stages(StageRegistry& r);
Status register_rand_gaussian_blur_stage(StageRegistry& r);            ///< rand_gaussian_blur
Status register_rand_brightness_stage(StageRegistry& r);               ///< rand_brightness
Status register_rand_contrast_stage(StageRegistry& r);                 ///< rand_contrast
Status register_rand_simulate_low_resolution_stage(StageRegistry& r);  ///< rand_simulate_low_resolution
Status register_medsam_box_stage(StageRegistry& r);                    ///< medsam_box
/// medsam_normalize, minmax_slices, repeat_channels, resize_longest_side, remove_small_objects
Status register_medsam_preprocess_stages(StageRegistry& r);

}  // namespace segflow::pipeline
