#pragma once
// A network as the rest of segflow sees it: its row in the network table (NetworkRow, listed
// in models/nets/registry.cpp), the options a job config's `model` section is read into
// (ModelOptions: the row and that network's own options struct), and the built module behind
// a uniform forward (ModelHandle, with what a caller needs to know to feed it: ModelInfo).
//
// Adding a network: a new file in nets/ with its module, its options struct and a function
// returning its row (NetworkRow via network_row<Options>(...), its hooks set), one line in
// network_table() (registry.cpp), its planning rule (models/planning/) and tests. A hook a
// row leaves empty is a feature the network does not have: the caller says so, naming the
// network (e.g. `segflow export --to pytorch` of a network without a `pytorch` hook).

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include <any>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "messages/status.hpp"
#include "pipeline/fwd.hpp"

namespace torch::nn {
class Module;
}

namespace segflow::models {

/// What a caller needs to know to feed a model and read its outputs.
struct ModelInfo {
  std::string name;      ///< the network's name in the table ("unet", "plain_unet", "sam", ...)
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

/// The keys of a `model.weights` mapping besides path (and strict, kept in ModelOptions).
struct WeightsOptions {
  std::string names = "auto";     ///< auto | segflow | a network's foreign names (monai, nnunet)
  std::vector<std::string> skip;  ///< regexes over segflow names: keep the fresh initialisation
  bool reinit_head = false;       ///< the output layer keeps its fresh initialisation
  std::string channels = "none";  ///< none | repeat | mean: input-channel adaptation

  /// True when every key has its default (a plain `weights: PATH` says the same).
  bool is_default() const;
};

struct NetworkRow;

/// A job config's `model` section, typed: which network (its row in the table), that
/// network's options, and the weights loaded after construction.
struct ModelOptions {
  /// The network's row in the table (registry.hpp); null until a `model` section is read.
  const NetworkRow* network = nullptr;
  /// The row's options struct (UNetOptions, PlainConvUNetOptions, SamModelOptions, ...).
  std::any net;
  std::string
      weights;  ///< segflow tensor archive (models/nets/weights.hpp) loaded after construction; "" = none
  bool weights_strict = true;  ///< every tensor of the archive must match a parameter or buffer
  /// How `weights` is mapped and adapted when given as a mapping (models/nets/pretrained.hpp).
  WeightsOptions weights_options;

  /// The network's name ("unet", ...); "" when none is set.
  std::string name() const;
  /// The network's options when they are a T, else null.
  template <class T>
  const T* get_if() const {
    return std::any_cast<T>(&net);
  }
  template <class T>
  T* get_if() {
    return std::any_cast<T>(&net);
  }
  /// The network's options as a T; std::bad_any_cast when they are another network's.
  template <class T>
  const T& get() const {
    return std::any_cast<const T&>(net);
  }
};

/// A network in a reference implementation's terms (`segflow export --to pytorch`).
struct ExportedModel {
  std::string target;  ///< "monai.networks.nets.UNet" | "segment_anything.modeling.Sam" | PlainConvUNet
  /// (name, tensor) in the module's order, named as the target's state_dict() names them.
  std::vector<std::pair<std::string, at::Tensor>> state_dict;
  /// {"target": ..., "args": {...}} (for Sam: {"image_encoder": {...}, "prompt_encoder": {...},
  /// "mask_decoder": {...}}), what tests/tools/export_check.py builds the module from.
  nlohmann::json spec;
};

/// Another implementation's tensor names for a network (`model.weights: {names: SCHEME}`).
struct ForeignNames {
  std::string scheme;  ///< what model.weights.names says: "monai", "nnunet"
  std::string what;    ///< whose names, for messages: "MONAI's UNet"
  /// A prefix only that implementation's names have ("model."): names: auto picks this scheme
  /// for an archive with such a name.
  std::string marker;
  /// The renaming for a network of options `net` whose own tensors are `model_names`: a
  /// foreign name -> its segflow name, "" for a name without one.
  std::function<std::function<std::string(const std::string&)>(const std::any& net,
                                                               const std::vector<std::string>& model_names)>
      renamer;
  /// Names that hold a tensor again under a second name (dropped, not "unused"); may be empty.
  std::function<bool(const std::string&)> duplicate;
};

/// One row of the network table: everything segflow needs to know of one network.
struct NetworkRow {
  std::string name;         ///< `model.name` ("unet")
  std::string description;  ///< a few words for help and errors ("MONAI's UNet")
  /// The network's options struct with its defaults, held as ModelOptions::net.
  std::function<std::any()> defaults;
  /// Binds the network's own keys of a `model` section (every key but name, weights and
  /// weights_strict) on `p` into `net`; bad values fail on `p`, naming the key.
  std::function<void(pipeline::OptionParser& p, std::any& net)> bind;
  /// The module built from `net` (on the CPU, fresh initialisation).
  std::function<Result<ModelHandle>(const std::any& net)> build;
  /// Input channels of the first convolution (model.weights.channels adapts them).
  std::function<std::int64_t(const std::any& net)> in_channels;
  /// Name prefixes of the output layer's tensors (model.weights.reinit_head); empty: none.
  std::vector<std::string> head_prefixes;
  /// Other implementations whose weights load into this network by name.
  std::vector<ForeignNames> foreign_names;
  /// Export hook of `segflow export --to pytorch` (and the nnU-Net checkpoint's weights): the
  /// module in its reference implementation's names and arguments. Empty: not exportable.
  std::function<Result<ExportedModel>(const std::any& net, const torch::nn::Module& module)> pytorch;
};

/// A row whose hooks take the network's own options type: `bind(p, options)`,
/// `build(options)`, `in_channels(options)`; the other hooks are set on the returned row
/// (wrap typed functions with `typed_hook<Options>`).
template <class Options>
NetworkRow network_row(std::string name, std::string description,
                       void (*bind)(pipeline::OptionParser&, Options&),
                       Result<ModelHandle> (*build)(const Options&),
                       std::int64_t (*in_channels)(const Options&)) {
  NetworkRow r;
  r.name = std::move(name);
  r.description = std::move(description);
  r.defaults = [] { return std::any(Options{}); };
  r.bind = [bind](pipeline::OptionParser& p, std::any& net) { bind(p, std::any_cast<Options&>(net)); };
  r.build = [build](const std::any& net) { return build(std::any_cast<const Options&>(net)); };
  r.in_channels = [in_channels](const std::any& net) {
    return in_channels(std::any_cast<const Options&>(net));
  };
  return r;
}

/// A hook over `const std::any&` calling `f` with the network's own options type.
template <class Options, class R, class... Args>
std::function<R(const std::any&, Args...)> typed_hook(R (*f)(const Options&, Args...)) {
  return [f](const std::any& net, Args... args) {
    return f(std::any_cast<const Options&>(net), std::forward<Args>(args)...);
  };
}

}  // namespace segflow::models
