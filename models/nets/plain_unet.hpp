#pragma once
// PlainConvUNet (network "plain_unet"): nnU-Net's PlainConvUNet (dynamic_network_architectures)
// for 2D and 3D, with instance norm + LeakyReLU(0.01), strided-conv downsampling,
// transposed-conv upsampling and deep supervision heads. It takes (N, C_in, *spatial) with
// spatial (Z, Y, X) or (Y, X) and returns logits. Strides and kernel sizes may differ per axis
// (nnU-Net's plans for thick-slice CT: stride [2, 2, 1], kernel [3, 3, 1]), held as AxisSizes
// in (x, y, z) order. Sub-modules inside ModuleLists are looked up at forward time (never
// cached in typed members), because Cloneable::clone replaces a ModuleList's elements.

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "messages/status.hpp"
#include "models/nets/axis_sizes.hpp"
#include "models/nets/layers.hpp"
#include "models/nets/network.hpp"
#include "pipeline/fwd.hpp"

namespace segflow::models {

/// What nnU-Net's UNets share (PlainConvUNet here, ResidualEncoderUNet in res_enc_unet.hpp):
/// stages, features, kernels, strides and the decoder; defaults follow nnU-Net's 3D
/// full-resolution plans.
struct ConvUNetTopology {
  int spatial_dims = 3;                  ///< 2 or 3
  int64_t in_channels = 1;               ///< >= 1
  int64_t num_classes = 2;               ///< output channels incl. background
  int64_t n_stages = 5;                  ///< encoder stages, >= 2
  int64_t base_features = 32;            ///< features of stage 0; doubled per stage
  int64_t max_features = 320;            ///< cap (nnU-Net: 320 in 3D, 512 in 2D)
  int64_t n_conv_per_stage_decoder = 2;  ///< decoder convs per stage, >= 1
  int64_t kernel_size = 3;               ///< odd; every conv on every axis unless kernel_sizes is set
  /// Conv kernel per stage (n_stages entries), each odd and >= 1: an integer or one per axis in
  /// (x, y, z) order ((x, y) in 2D). The decoder stage that joins the skip of stage s uses
  /// kernel_sizes[s] (nnU-Net). Empty = kernel_size everywhere.
  std::vector<AxisSizes> kernel_sizes;
  /// Stride of the first conv of each stage (n_stages entries), each >= 1: an integer or one
  /// per axis (x, y, z); the decoder's transposed convs upsample by the same. Empty = 1, 2, 2, ...
  std::vector<AxisSizes> strides;
  bool deep_supervision = true;        ///< return one output per decoder stage
  bool conv_bias = true;               ///< nnU-Net plans use biases
  double negative_slope = 0.01;        ///< LeakyReLU slope
  NormKind norm = NormKind::instance;  ///< instance (affine) as nnU-Net; batch possible

  /// The shared fields' rules; errors start with "<net>: ".
  Status validate_topology(const std::string& net) const;
  /// Features per stage: min(base * 2^s, max).
  std::vector<int64_t> features() const;
  /// Strides per stage (the default resolved).
  std::vector<AxisSizes> resolved_strides() const;
  /// Kernel sizes per stage (the default resolved).
  std::vector<AxisSizes> resolved_kernel_sizes() const;
  /// Per axis (x, y[, z]): the product of the strides on that axis.
  std::vector<int64_t> size_divisors() const;
  /// The least common multiple of size_divisors().
  int64_t size_divisor() const;
};

/// Options of PlainConvUNet: the topology and the encoder's convs per stage.
struct PlainConvUNetOptions : ConvUNetTopology {
  int64_t n_conv_per_stage = 2;  ///< encoder convs per stage, >= 1

  Status validate() const;
};

/// nnU-Net PlainConvUNet. forward returns logits, full resolution first: with deep
/// supervision n_stages - 1 tensors, each at the resolution of its decoder stage (divided by
/// the strides per axis), else one tensor.
class PlainConvUNetImpl : public torch::nn::Cloneable<PlainConvUNetImpl> {
 public:
  explicit PlainConvUNetImpl(PlainConvUNetOptions options);
  void reset() override;
  std::vector<at::Tensor> forward(const at::Tensor& x);
  void pretty_print(std::ostream& stream) const override;

  PlainConvUNetOptions options;
  torch::nn::ModuleList encoder_stages{nullptr};  ///< ModuleList of ConvBlocks per stage
  torch::nn::ModuleList transpconvs{nullptr};     ///< decoder stage s: below -> skip features
  torch::nn::ModuleList decoder_stages{nullptr};  ///< ModuleList of ConvBlocks per stage
  torch::nn::ModuleList seg_layers{nullptr};      ///< 1x1 convs to num_classes
};
TORCH_MODULE(PlainConvUNet);

/// The row of "plain_unet" in the network table (models/nets/registry.cpp): its options
/// binding, build, nnU-Net names and PyTorch export (dynamic_network_architectures'
/// PlainConvUNet).
NetworkRow plain_unet_network();

/// Binds the topology's keys of a `model` section (spatial_dims, in_channels, out_channels,
/// n_stages, base_features, max_features, n_conv_per_stage_decoder, kernel_size, kernel_sizes,
/// strides, deep_supervision, conv_bias, negative_slope, norm).
void bind_conv_unet_topology(pipeline::OptionParser& p, ConvUNetTopology& o);

/// The dynamic_network_architectures constructor arguments both UNets share (input_channels,
/// n_stages, features_per_stage, conv_op, kernel_sizes and strides in nnU-Net's (z, y, x)
/// order, num_classes, n_conv_per_stage_decoder, conv_bias, norm_op(_kwargs), nonlin(_kwargs),
/// deep_supervision).
nlohmann::json nnunet_topology_args(const ConvUNetTopology& o);

/// ModelInfo of a UNet of this topology named `name`.
ModelInfo conv_unet_info(const std::string& name, const ConvUNetTopology& o);

/// The export hook both nnU-Net UNets share: `module` (network `net`) as
/// dynamic_network_architectures' `target` class, every tensor under each name `names` gives
/// it, and nnunet_topology_args(o) with `extra_args` added. A network with norm none is
/// refused (no such layout).
Result<ExportedModel> export_nnunet_unet(
    const std::string& net, const std::string& target, const ConvUNetTopology& o,
    const torch::nn::Module& module,
    const std::function<Result<std::vector<std::string>>(const std::string&)>& names,
    const nlohmann::json& extra_args);

/// The `nnunet` weight-name scheme of an nnU-Net UNet (`what`: "nnU-Net's PlainConvUNet"):
/// picked by `marker`, renamed by `rename`, nnU-Net's duplicate entries (all_modules.*,
/// decoder.encoder.*) dropped.
ForeignNames nnunet_foreign_names(std::string what, std::string marker,
                                  std::function<std::string(const std::string&)> rename);

}  // namespace segflow::models
