#pragma once
// nnU-Net v2's planning rules (nnunetv2 2.8.1: experiment_planners/default_experiment_planner.py
// ExperimentPlanner, network_topology.py get_pool_and_conv_props, dynamic_network_architectures'
// compute_conv_feature_map_size), written from the rules, with Python's arithmetic where it
// decides a result (round half to even, float patch sizes before padding, numpy's linear
// percentile). Everything here is in nnU-Net's axis order: array order (z, y, x) after
// transpose_forward (the largest-spacing axis first). Pure functions, thread-safe.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace segflow::models::planning {

/// The constants of nnU-Net's ExperimentPlanner (names as there).
struct NnunetConstants {
  double anisotropy_threshold = 3.0;        ///< ANISO_THRESHOLD
  std::int64_t base_num_features = 32;      ///< UNet_base_num_features
  double reference_val_3d = 560000000.0;    ///< UNet_reference_val_3d (feature map voxels)
  double reference_val_2d = 85000000.0;     ///< UNet_reference_val_2d
  double reference_val_corresp_gb = 8.0;    ///< UNet_reference_val_corresp_GB
  std::int64_t reference_bs_2d = 12;        ///< UNet_reference_val_corresp_bs_2d
  std::int64_t reference_bs_3d = 2;         ///< UNet_reference_val_corresp_bs_3d
  std::int64_t featuremap_min_edge = 4;     ///< UNet_featuremap_min_edge_length
  std::int64_t blocks_per_stage = 2;        ///< UNet_blocks_per_stage_encoder / _decoder
  std::int64_t min_batch_size = 2;          ///< UNet_min_batch_size
  std::int64_t max_features_2d = 512;       ///< UNet_max_features_2d
  std::int64_t max_features_3d = 320;       ///< UNet_max_features_3d
  double max_dataset_covered = 0.05;        ///< batch covers at most 5% of the dataset's voxels
  double lowres_creation_threshold = 0.25;  ///< 3d_lowres when the patch covers < 25% of the median
  double lowres_spacing_increase = 1.03;    ///< spacing_increase_factor of the 3d_lowres search
  /// The network planned: PlainConvUNet (blocks_per_stage convs per encoder and decoder
  /// stage), or, for the residual encoder planners (ResEncUNetPlanner), ResidualEncoderUNet
  /// with nnunet_resenc_blocks(n) (models/nets/res_enc_unet.hpp) blocks per encoder stage and
  /// one conv per decoder stage.
  bool residual_encoder = false;
  /// The default planner shrinks the patch while estimate / ref_bs * 2 > reference (the
  /// estimate per batch of 2); the ResEnc planners while estimate > reference.
  bool estimate_per_batch_of_2 = true;
};

/// "5%", "100%": a share as a whole percentage (a note's max_dataset_covered).
std::string fmt_percent(double share);

/// The constants of one of nnU-Net's planners, by `segflow plan --preset` name: "default"
/// (ExperimentPlanner), "resenc-m" (nnUNetPlannerResEncM), "resenc-l" (...ResEncL), "resenc-xl"
/// (...ResEncXL). Null for another name.
const NnunetConstants* preset_constants(const std::string& preset);
/// The preset names, in order: default, resenc-m, resenc-l, resenc-xl.
std::vector<std::string> preset_names();
/// "" for a preset name, else "expected one of default, resenc-m, resenc-l, resenc-xl, got
/// 'NAME'" (the caller puts its field before it).
std::string preset_error(const std::string& preset);
/// The memory target each preset was made for (8, 8, 24, 40 GB).
double preset_memory_gb(const std::string& preset);
/// nnU-Net's planner class and plans name of a preset ("nnUNetPlannerResEncM",
/// "nnUNetResEncUNetMPlans"; "ExperimentPlanner", "nnUNetPlans" for the default).
std::pair<std::string, std::string> preset_nnunet_names(const std::string& preset);

/// A U-Net topology for a patch (get_pool_and_conv_props' result).
struct Topology {
  std::vector<std::int64_t> patch_size;                         ///< padded to must_be_divisible_by
  std::vector<std::vector<std::int64_t>> pool_op_kernel_sizes;  ///< per stage; stage 0 all 1
  std::vector<std::vector<std::int64_t>> conv_kernel_sizes;     ///< per stage
  std::vector<std::int64_t> num_pool_per_axis;
  std::vector<std::int64_t> must_be_divisible_by;  ///< 2^num_pool_per_axis
  std::int64_t n_stages() const { return static_cast<std::int64_t>(pool_op_kernel_sizes.size()); }
};

/// Python's round() of a float: half to even.
double py_round(double v);

/// numpy.percentile(values, q) (linear interpolation); NaN for no values.
double np_percentile(std::vector<double> values, double q);

/// get_pool_and_conv_props(spacing, patch_size, min_feature_map_size, max_numpool).
Topology pool_and_conv_props(const std::vector<double>& spacing, const std::vector<double>& patch_size,
                             std::int64_t min_feature_map_size, std::int64_t max_numpool = 999999);

/// pad_shape: each size up to the next multiple of its divisor (truncated to an integer).
std::vector<std::int64_t> pad_shape(const std::vector<double>& shape,
                                    const std::vector<std::int64_t>& divisor);

/// min(max, base * 2^s) for s < n_stages.
std::vector<std::int64_t> features_per_stage(std::int64_t n_stages, std::int64_t base, std::int64_t max);

/// PlainConvUNet.compute_conv_feature_map_size(patch): the voxels of every conv output,
/// transposed conv output and segmentation output (deep supervision: every decoder stage).
double conv_feature_map_size(const std::vector<std::int64_t>& patch, const Topology& t,
                             const std::vector<std::int64_t>& features, std::int64_t num_classes,
                             std::int64_t convs_per_stage, bool deep_supervision = true);

/// ResidualEncoderUNet.compute_conv_feature_map_size(patch): the stem's conv output, every
/// residual block's two conv outputs and its skip's (where the block pools or projects), and
/// the decoder as conv_feature_map_size counts it (`decoder_convs` convs per stage).
double res_enc_feature_map_size(const std::vector<std::int64_t>& patch, const Topology& t,
                                const std::vector<std::int64_t>& features, std::int64_t num_classes,
                                const std::vector<std::int64_t>& blocks_per_stage, std::int64_t decoder_convs,
                                bool deep_supervision = true);

/// determine_fullres_target_spacing: the median spacing, except for a much coarser axis with
/// few voxels (ratio > threshold on both), which takes the 10th percentile of its spacings
/// (at least the others' largest + 1e-5). `spacings` and `shapes` per case in array order.
std::vector<double> fullres_target_spacing(const std::vector<std::vector<double>>& spacings,
                                           const std::vector<std::vector<double>>& shapes, double threshold);

/// determine_transpose: the largest-spacing axis first, the others in order.
std::vector<int> transpose_forward(const std::vector<double>& target_spacing);
/// The inverse permutation.
std::vector<int> transpose_backward(const std::vector<int>& forward);

/// compute_new_shape: int(round(old_spacing / new_spacing * old_shape)) per axis.
std::vector<double> compute_new_shape(const std::vector<double>& shape,
                                      const std::vector<double>& old_spacing,
                                      const std::vector<double>& new_spacing);

/// nnU-Net's initial patch: 1/spacing scaled to 256^3 (3D) or 2048^2 (2D) voxels, rounded,
/// clipped to the median shape.
std::vector<double> initial_patch_size(const std::vector<double>& spacing,
                                       const std::vector<double>& median_shape);

/// The patch-shrinking sequence of get_plans_for_configuration: the initial topology, then
/// each smaller one nnU-Net would try (the axis largest relative to the median shape loses
/// one divisor step), until a topology has fewer than `min_stages` stages or an axis would
/// vanish; at most `limit` entries.
std::vector<Topology> shrink_sequence(const std::vector<double>& spacing,
                                      const std::vector<double>& median_shape,
                                      std::int64_t min_feature_map_size, std::size_t limit = 2000,
                                      std::int64_t min_stages = 3);

}  // namespace segflow::models::planning
