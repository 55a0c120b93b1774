#pragma once
// U-Nets for 2D and 3D:
//  - UNet: MONAI's monai.networks.nets.UNet (strided-conv down path, transposed-conv up path
//    with concatenated skips, optional residual units, final layer without norm/act).
//  - PlainConvUNet: nnU-Net's PlainConvUNet (dynamic_network_architectures) with instance
//    norm + LeakyReLU(0.01), strided-conv downsampling, transposed-conv upsampling and deep
//    supervision heads.
// Both take (N, C_in, *spatial) with spatial (Z, Y, X) or (Y, X) and return logits. Strides
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
#include "models/nets/layers.hpp"

namespace segflow::models {

/// Sizes per spatial axis as segflow's configs write them: one integer for every axis, or
/// one per axis in (x, y, z) order ((x, y) in 2D), like every other size in a segflow config
/// (crop spatial_size, resample spacing, validation roi_size). Tensors are (N, C, Z, Y, X):
/// dims() reverses into tensor order for the layers. (nnU-Net's plans.json and MONAI's
/// sequences list sizes in array order z, y, x: the reverse.)
class AxisSizes {
 public:
  AxisSizes(int64_t value = 1) : xyz_{value} {}  // NOLINT(google-explicit-constructor)
  AxisSizes(std::initializer_list<int64_t> xyz) : xyz_(xyz) {}
  explicit AxisSizes(std::vector<int64_t> xyz) : xyz_(std::move(xyz)) {}

  /// The values as written: one (every axis), or one per axis (x, y[, z]).
  const std::vector<int64_t>& xyz() const { return xyz_; }
  /// The size on axis a (0 = x, 1 = y, 2 = z).
  int64_t axis(size_t a) const { return xyz_.size() == 1 ? xyz_.front() : xyz_.at(a); }
  /// The same sizes in tensor order ((Z, Y, X) / (Y, X)).
  DimSizes dims() const;
  /// True when every axis has the size `v`.
  bool all_equal(int64_t v) const;
  /// As written: "2" or "[2, 2, 1]".
  std::string text() const;

  /// Equal sizes on every axis (a single value compares as that value on every axis).
  friend bool operator==(const AxisSizes& a, const AxisSizes& b);

 private:
  std::vector<int64_t> xyz_;
};

/// "(x, y, z)" or "(x, y)": the order of per-axis sizes, as error messages name it.
const char* axis_order_text(int spatial_dims);
/// An integer when one value was written, else the list (x, y[, z]).
void to_json(nlohmann::json& j, const AxisSizes& sizes);
/// "[2, [2, 2, 1], 2]".
std::string to_string(const std::vector<AxisSizes>& sizes);
/// Writes text().
std::ostream& operator<<(std::ostream& stream, const AxisSizes& sizes);

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

/// Options of PlainConvUNet; defaults follow nnU-Net's 3D full-resolution plans.
struct PlainConvUNetOptions {
  int spatial_dims = 3;                  ///< 2 or 3
  int64_t in_channels = 1;               ///< >= 1
  int64_t num_classes = 2;               ///< output channels incl. background
  int64_t n_stages = 5;                  ///< encoder stages, >= 2
  int64_t base_features = 32;            ///< features of stage 0; doubled per stage
  int64_t max_features = 320;            ///< cap (nnU-Net: 320 in 3D, 512 in 2D)
  int64_t n_conv_per_stage = 2;          ///< encoder convs per stage, >= 1
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

  Status validate() const;
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

}  // namespace segflow::models
