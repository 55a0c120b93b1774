#pragma once
// Models by name with options from a job config: create_model("unet" | "plain_unet" | "sam",
// options) -> ModelHandle, a uniform front over the three networks.
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
//   Per-axis sizes (unet strides entries, kernel_size, up_kernel_size; plain_unet strides and
//   kernel_sizes entries) are an integer for every axis or a list in (x, y, z) order, (x, y)
//   in 2D, like every size in a segflow config (AxisSizes in models/nets/unet.hpp):
//     strides: [[1, 1, 1], [2, 2, 1], [2, 2, 2]]   # thick slices: no pooling along z first
//   sam:         preset (tiny|small|vit_b, default tiny), img_size, patch_size, embed_dim,
//                depth, num_heads, mlp_ratio, out_chans, use_rel_pos, window_size,
//                global_attn_indexes, decoder_depth, decoder_heads, decoder_mlp_dim,
//                num_multimask_outputs, iou_head, freeze_image_encoder,
//                freeze_prompt_encoder (default true), freeze_mask_decoder
//                (spatial_dims must be 2, out_channels 1; in_channels maps to in_chans)
// clang-format on
// Defaults are those of the option structs (UNetOptions, PlainConvUNetOptions, SamOptions);
// a job config's `model` section is read into ModelOptions by parse_model_options (the one
// option reader, pipeline/options.hpp), and create_model builds the network from it.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <nlohmann/json_fwd.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "messages/status.hpp"
#include "models/nets/pretrained.hpp"
#include "models/nets/sam.hpp"
#include "models/nets/unet.hpp"
#include "pipeline/fwd.hpp"

namespace torch::nn {
class Module;
}

namespace segflow::models {

/// What a caller needs to know to feed a model and read its outputs.
struct ModelInfo {
  std::string name;      ///< "unet", "plain_unet", "sam"
  int spatial_dims = 3;  ///< 2 or 3
  int64_t in_channels = 1;
  int64_t out_channels = 2;       ///< logit channels (1 for sam: sigmoid)
  bool needs_box = false;         ///< forward needs a (B, 4) box tensor (sam)
  bool deep_supervision = false;  ///< forward returns several resolutions
  int64_t size_divisor = 1;       ///< lcm of size_divisors: a size that is a multiple fits every axis
  int64_t fixed_size = 0;         ///< > 0: inputs must be exactly this size per axis (sam)
  /// Per axis (x, y[, z]): every spatial input size on that axis must be a multiple of it (the
  /// product of the strides on that axis).
  std::vector<int64_t> size_divisors;
  /// forward returns {mask logits, IoU predictions (B, 1)} (a sam with its IoU head); the
  /// trainer adds loss.iou_weight x iou_prediction_loss.
  bool iou_output = false;
};

/// ok when an input size (x, y[, z]) fits the model: each axis a multiple of its size divisor
/// (entries <= 0, "the whole axis", and axes past the model's, e.g. the z of a 2D model's
/// (x, y, 1) crops, are not checked; models with a fixed size are not checked). Else
/// invalid_config "<field>: expected a multiple of 16 on y (the product of model.strides on
/// y; per axis (x, y, z): [16, 16, 4]), got [96, 90, 20]".
Status check_input_size(const ModelInfo& info, const std::vector<int64_t>& xyz, const std::string& field);

/// check_input_size on what a job feeds the model, at config time: the spatial_size of every
/// crop stage (a stage whose name contains "crop": its output has that size; one integer
/// stands for every axis) and the validation window roi_size (x, y[, z]). Errors name
/// "<label>: stages[3].options.spatial_size" or "<label>: validation.roi_size".
Status check_input_sizes(const ModelInfo& info, const pipeline::PipelineSpec& stages,
                         const std::vector<int64_t>& roi_size, const std::string& label);

/// A network with a uniform forward. Copies share the module; clone() makes an independent
/// copy (per device). Not thread-safe: one handle per trainer thread.
class ModelHandle {
 public:
  using ForwardFn =
      std::function<std::vector<at::Tensor>(torch::nn::Module&, const at::Tensor&, const at::Tensor&)>;
  ModelHandle(ModelInfo info, std::shared_ptr<torch::nn::Module> module, ForwardFn forward);

  /// image (N, C, *spatial), box (N, 4) for needs_box models (ignored otherwise) -> logits,
  /// full resolution first (one tensor unless deep supervision is on).
  std::vector<at::Tensor> forward(const at::Tensor& image, const at::Tensor& box = {}) const;
  /// The full-resolution logits only (for inference and sliding windows).
  at::Tensor predict(const at::Tensor& image, const at::Tensor& box = {}) const;
  /// Deep copy of the module (Cloneable::clone), optionally onto a device.
  ModelHandle clone(const std::optional<c10::Device>& device = std::nullopt) const;
  const ModelInfo& info() const { return info_; }
  torch::nn::Module& module() const { return *module_; }
  const std::shared_ptr<torch::nn::Module>& module_ptr() const { return module_; }
  /// Parameters that require grad (what the optimizer gets).
  std::vector<at::Tensor> trainable_parameters() const;

 private:
  ModelInfo info_;
  std::shared_ptr<torch::nn::Module> module_;
  ForwardFn forward_;
};

/// SAM as a config names it: a preset and the options it resolved to after the keys that
/// override it field by field.
struct SamModelOptions {
  std::string preset = "tiny";                          ///< tiny | small | vit_b
  SamOptions sam = SamOptions::preset("tiny").value();  ///< the preset with overrides, resolved
};

/// A job config's `model` section, typed: which network (the alternative held), its options,
/// and the weights loaded after construction.
struct ModelOptions {
  std::variant<UNetOptions, PlainConvUNetOptions, SamModelOptions> net;  ///< unet | plain_unet | sam
  std::string
      weights;  ///< segflow tensor archive (models/nets/weights.hpp) loaded after construction; "" = none
  bool weights_strict = true;  ///< every tensor of the archive must match a parameter or buffer

  /// "unet", "plain_unet" or "sam".
  std::string name() const;
  /// How `weights` is mapped and adapted when given as a mapping (models/nets/pretrained.hpp).
  WeightsOptions weights_options;
};

/// Reads a `model` section: "name" (unet | plain_unet | sam; required) and that network's
/// keys. Unknown keys and bad values are invalid_config errors naming `where` and the key:
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

/// "unet", "plain_unet", "sam".
std::vector<std::string> known_models();

}  // namespace segflow::models
