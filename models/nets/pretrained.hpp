#pragma once
// Starting from someone else's weights (fine-tuning): `model.weights` as a mapping
//   weights: {path: spleen.sfta, names: auto, skip: ['^up\.0\.'], reinit_head: true,
//             channels: repeat}
// reads a segflow tensor archive (models/nets/weights.hpp; scripts/convert_sam_weights.py turns a
// PyTorch state dict into one, keeping its names), maps the names of the network it came
// from onto segflow's, and copies what fits:
// clang-format off
//   names:       segflow (as they are) | a scheme of the network's row (ForeignNames,
//                models/nets/network.hpp): monai (monai.networks.nets.UNet's state_dict
//                names, "model.1.submodule.0.conv.unit0.conv.weight", into a unet), nnunet
//                (dynamic_network_architectures' PlainConvUNet names, "encoder.stages.0.0.
//                convs.0.conv.weight", into a plain_unet) | auto (the network's scheme whose
//                marker some archive name starts with: "model." for monai, "encoder.stages."
//                for nnunet; else segflow).
//   skip:        regular expressions (ECMAScript, matched against the whole segflow name):
//                those tensors keep their fresh initialisation; the archive's tensors of
//                those names are not needed.
//   reinit_head: the output layer keeps its fresh initialisation (another class count): the
//                row's head_prefixes, a unet's last up layer ("up.0."), a plain_unet's
//                segmentation layers ("seg_layers.", deep supervision's included). SAM has
//                no head to re-init.
//   channels:    none | repeat | mean: a weight (>= 3 dims) that differs from the model only
//                in its input-channel axis (dim 1) where the model has in_channels there (the
//                first convolution and its residual projection) is adapted: repeat takes
//                source channel c mod C_src for channel c, mean the mean of all source
//                channels; both are then scaled by C_src / C_model, so an image whose
//                channels are all equal gives the source network's output (exactly when
//                C_model is a multiple of C_src for repeat; always for mean).
// model.weights_strict (default true): model tensors the archive lacks and archive tensors
// the model lacks are errors, except those skipped or re-initialised.
// clang-format on
// A shape that does not fit and is not skipped, re-initialised or adapted is an error that
// names every such tensor with both shapes; on any error nothing is copied. The outcome is a
// WeightsReport (counts and names of loaded, skipped, reinitialised, adapted tensors, plus
// the frozen ones the trainer adds): the trainer logs its summary and writes
// weights_report.json into the run folder.

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "messages/status.hpp"
#include "models/nets/network.hpp"

namespace torch::nn {
class Module;
}

namespace segflow::models {

/// The values `model.weights.channels` accepts: none, repeat, mean.
const std::vector<std::string>& channel_adaptations();

/// What a load did, tensor by tensor (segflow names).
struct WeightsReport {
  std::string path;                        ///< the archive ("" = no weights loaded)
  std::string names;                       ///< the name scheme used (auto resolved)
  std::vector<std::string> loaded;         ///< copied as they are
  std::vector<std::string> skipped;        ///< matched a skip rule: freshly initialised
  std::vector<std::string> reinitialised;  ///< the head (reinit_head): freshly initialised
  std::vector<std::string> adapted;        ///< input channels repeated / averaged
  std::vector<std::string> unused;         ///< archive tensors nothing took (non-strict)
  std::vector<std::string> missing;        ///< model tensors the archive lacks (non-strict)
  std::vector<std::string> frozen;         ///< parameters train.freeze matches (the trainer's)
  std::int64_t unfreeze_epoch = 0;         ///< train.unfreeze_epoch (0 = never)

  /// {"path", "names", "counts": {"loaded": n, ...}, "loaded": [...], ...}.
  nlohmann::json to_json() const;
  /// One line: "weights spleen.sfta (monai names): 52 loaded, 0 skipped, 8 reinitialised, ...".
  std::string summary() const;
};

/// Loads `path` into `module`, built from `options`, as `weights` says (see the file
/// comment). invalid_argument naming the path and the tensors for shapes that do not fit,
/// strict misses and bad regexes; nothing is copied then.
Result<WeightsReport> load_pretrained(torch::nn::Module& module, const ModelOptions& options,
                                      const std::string& path, const WeightsOptions& weights, bool strict);

/// The names of the parameters `patterns` (regexes over whole names, train.freeze) match.
/// invalid_argument "<field>: ..." for a bad regex or one that matches no parameter.
Result<std::vector<std::string>> frozen_parameters(const torch::nn::Module& module,
                                                   const std::vector<std::string>& patterns,
                                                   const std::string& field);

}  // namespace segflow::models
