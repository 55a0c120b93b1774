#pragma once
// The network table: models by name with options from a job config. create_model(options) ->
// ModelHandle, a uniform front over every network; a network is one row (NetworkRow,
// models/nets/network.hpp) of network_table().
//
// clang-format off
// Option keys (all optional; unknown keys are errors that list the known ones):
//   every model: spatial_dims, in_channels, out_channels, weights (path of a segflow tensor
//     archive loaded after construction, or {path, names, skip, reinit_head, channels}:
//     models/nets/pretrained.hpp), weights_strict (default true)
//   unet:        channels, strides, kernel_size, up_kernel_size, num_res_units, norm
//                (batch|instance|none), act (relu|prelu|leakyrelu), dropout, bias
//   plain_unet:  n_stages, base_features, max_features, n_conv_per_stage,
//                n_conv_per_stage_decoder, kernel_size, kernel_sizes, strides,
//                deep_supervision, conv_bias, negative_slope, norm   (out_channels = classes)
//   res_enc_unet: plain_unet's keys with n_blocks_per_stage (residual blocks per encoder stage,
//                default nnU-Net's 1, 3, 4, 6, 6, ...) for n_conv_per_stage, and
//                n_conv_per_stage_decoder default 1
//   Per-axis sizes (unet strides entries, kernel_size, up_kernel_size; plain_unet and res_enc_unet strides and
//   kernel_sizes entries) are an integer for every axis or a list in (x, y, z) order, (x, y)
//   in 2D, like every size in a segflow config (AxisSizes in models/nets/axis_sizes.hpp):
//     strides: [[1, 1, 1], [2, 2, 1], [2, 2, 2]]   # thick slices: no pooling along z first
//   sam:         preset (tiny|small|vit_b, default tiny), img_size, patch_size, embed_dim,
//                depth, num_heads, mlp_ratio, out_chans, use_rel_pos, window_size,
//                global_attn_indexes, decoder_depth, decoder_heads, decoder_mlp_dim,
//                num_multimask_outputs, iou_head, freeze_image_encoder,
//                freeze_prompt_encoder (default true), freeze_mask_decoder
//                (spatial_dims must be 2, out_channels 1; in_channels maps to in_chans)
// clang-format on
// Defaults are those of the option structs (UNetOptions, PlainConvUNetOptions, ResEncUNetOptions,
// SamOptions);
// a job config's `model` section is read into ModelOptions by parse_model_options (the one
// option reader, pipeline/options.hpp), and create_model builds the network from it.

#include <nlohmann/json_fwd.hpp>

#include <string>
#include <vector>

#include "messages/status.hpp"
#include "models/nets/network.hpp"
#include "models/nets/pretrained.hpp"

namespace segflow::models {

/// Every network segflow builds, one row each, in the order help and errors list them.
const std::vector<NetworkRow>& network_table();

/// The row named `name`; invalid_argument "model: unknown name 'resnet'; known models: unet,
/// plain_unet, sam" otherwise.
Result<const NetworkRow*> find_network(const std::string& name);

/// The names of network_table(), in its order ("unet", "plain_unet", "sam", ...).
std::vector<std::string> known_models();

/// The values `model.weights.names` accepts: auto, segflow and every network's foreign name
/// schemes (monai, nnunet).
std::vector<std::string> weights_name_schemes();

/// Reads a `model` section: "name" (a known model; required) and that network's keys.
/// Unknown keys and bad values are invalid_config errors naming `where` and the key:
/// "configs/job.yaml: model.channelz: unknown option; expected name, spatial_dims, ...".
Result<ModelOptions> parse_model_options(const nlohmann::json& j, const std::string& where = "model");
/// Every option with "name", defaults included (what a run folder's config.json holds).
void to_json(nlohmann::json& j, const ModelOptions& options);

/// Builds a model from its options (on the CPU), then loads `weights` when set, as
/// weights_options says (models/nets/pretrained.hpp); what the load did goes to `report` when
/// given. Errors of weights loading pass through with the path.
Result<ModelHandle> create_model(const ModelOptions& options, WeightsReport* report = nullptr);

/// The same from a name and a JSON object of that network's options (no "name" key).
/// invalid_argument for an unknown name (listing the known ones); unknown option keys (listing
/// the known keys) and bad values are errors naming "<name>.<key>".
Result<ModelHandle> create_model(const std::string& name, const nlohmann::json& options);

}  // namespace segflow::models
