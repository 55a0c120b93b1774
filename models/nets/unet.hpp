#pragma once
// UNet (network "unet"), MONAI's monai.networks.nets.UNet for 2D and 3D: strided-conv down
// path, transposed-conv up path with concatenated skips, optional residual units, final layer
// without norm/act. (nnU-Net's PlainConvUNet is models/nets/plain_unet.hpp.)
// It takes (N, C_in, *spatial) with spatial (Z, Y, X) or (Y, X) and return logits. Strides
// and kernel sizes may differ per axis (anisotropic topologies such as nnU-Net's plans for
// thick-slice CT: stride [2, 2, 1], kernel [3, 3, 1]); the options hold them as AxisSizes in
// (x, y, z) order, like every size in a segflow config, and the layers get tensor order.
// Sub-modules inside ModuleLists are looked up at forward time (never cached in typed
// members), because Cloneable::clone replaces a ModuleList's elements with clones.

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include "messages/status.hpp"
#include "models/nets/axis_sizes.hpp"
#include "models/nets/layers.hpp"
#include "models/nets/network.hpp"

namespace segflow::models {

/// Options of UNet; defaults are MONAI's, except instance norm has learned affine weights.
/// MONAI's fast-training tutorial: channels {16,32,64,128,256}, strides {2,2,2,2},
/// num_res_units 2, norm batch.
struct UNetOptions {
  int spatial_dims = 3;                                    ///< 2 or 3
  int64_t in_channels = 1;                                 ///< >= 1
  int64_t out_channels = 2;                                ///< classes incl. background, >= 1
  std::vector<int64_t> channels = {16, 32, 64, 128, 256};  ///< per level, >= 2 entries
  /// Downsampling from level i to i + 1, channels.size() - 1 entries: each an integer or one
  /// per axis in (x, y, z) order ((x, y) in 2D), >= 1 ([2, 2, 1]: no downsampling along z).
  std::vector<AxisSizes> strides = {2, 2, 2, 2};
  AxisSizes kernel_size = 3;           ///< every conv: odd, >= 1; one integer or one per axis (x, y, z)
  AxisSizes up_kernel_size = 3;        ///< every transposed conv: odd, >= 1; one or one per axis (x, y, z)
  int64_t num_res_units = 0;           ///< 0: plain conv blocks; >= 1 residual
  NormKind norm = NormKind::instance;  ///< batch | instance (affine) | none
  ActKind act = ActKind::prelu;        ///< relu | prelu | leakyrelu
  double dropout = 0.0;                ///< probability in [0, 1)
  bool bias = true;                    ///< conv biases

  /// invalid_argument naming the bad field, or ok.
  Status validate() const;
  /// Per axis (x, y[, z]): the product of the strides on that axis; every input size on that
  /// axis must be divisible by it.
  std::vector<int64_t> size_divisors() const;
  /// The least common multiple of size_divisors(): a size divisible by it fits every axis.
  int64_t size_divisor() const;
};

/// MONAI's ResidualUnit: `subunits` conv blocks (the first strided) plus a residual path
/// (identity, 1x1 conv when only channels change, or a strided kxk conv). With
/// residual = false it is a single conv block (MONAI's down layer with num_res_units 0).
struct ResidualUnitOptions {
  ConvBlockOptions block;       ///< first unit; later units have stride 1 and out->out channels
  int64_t subunits = 2;         ///< >= 1
  bool residual = true;         ///< add the residual path
  bool last_conv_only = false;  ///< last unit without norm/act (MONAI's top up layer)
};

class ResidualUnitImpl : public torch::nn::Cloneable<ResidualUnitImpl> {
 public:
  explicit ResidualUnitImpl(ResidualUnitOptions options);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);
  void pretty_print(std::ostream& stream) const override;

  ResidualUnitOptions options;
  torch::nn::ModuleList conv{nullptr};  ///< "conv.unit0", ... as MONAI (ConvBlocks)
  ConvNd residual{nullptr};             ///< null for the identity residual
};
TORCH_MODULE(ResidualUnit);

/// MONAI's up layer: transposed conv block, then (num_res_units > 0) one residual unit.
class UpLayerImpl : public torch::nn::Cloneable<UpLayerImpl> {
 public:
  UpLayerImpl(ConvBlockOptions transposed, bool with_residual, ResidualUnitOptions residual);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);

  ConvBlockOptions up_options;
  bool with_residual;
  ResidualUnitOptions residual_options;
  ConvBlock conv{nullptr};
  ResidualUnit ru{nullptr};
};
TORCH_MODULE(UpLayer);

/// MONAI UNet. forward: (N, in, *spatial) -> (N, out, *spatial); the spatial size on each
/// axis must be divisible by that axis's size_divisors() entry (as in MONAI, where it would
/// fail in the concatenation).
class UNetImpl : public torch::nn::Cloneable<UNetImpl> {
 public:
  explicit UNetImpl(UNetOptions options);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);
  void pretty_print(std::ostream& stream) const override;

  UNetOptions options;
  torch::nn::ModuleList down{nullptr};  ///< level i: channels[i-1] -> channels[i], stride s_i
  ResidualUnit bottom{nullptr};         ///< channels[n-2] -> channels[n-1], stride 1
  torch::nn::ModuleList up{nullptr};    ///< level i: skip + below -> channels[i-1] (out at 0)
};
TORCH_MODULE(UNet);

/// The row of "unet" in the network table (models/nets/registry.cpp): its options binding,
/// build, MONAI names and PyTorch export (monai.networks.nets.UNet).
NetworkRow unet_network();

}  // namespace segflow::models
