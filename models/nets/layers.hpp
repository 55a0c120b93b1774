#pragma once
// Building blocks shared by the networks: a convolution that works in 2D and 3D (plain or
// transposed), batch/instance norm for either, activations, and SAM's LayerNorm2d.
// All are torch::nn::Cloneable with their parameters registered in reset(), so clone()
// (one copy per device) and state dicts behave like LibTorch's own modules. Parameter and
// buffer names follow PyTorch (weight, bias, running_mean, running_var, ...).

#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include "messages/status.hpp"
#include "pipeline/fwd.hpp"

namespace segflow::models {

/// Normalisation after a convolution.
enum class NormKind { none, batch, instance };
/// Non-linearity after a normalisation.
enum class ActKind { none, relu, prelu, leakyrelu, gelu };

/// "batch", "instance", "none" -> NormKind; other text is an invalid_argument listing these.
Result<NormKind> parse_norm(const std::string& s);
/// "relu", "prelu", "leakyrelu", "gelu", "none" -> ActKind.
Result<ActKind> parse_act(const std::string& s);
const char* to_string(NormKind k) noexcept;
const char* to_string(ActKind k) noexcept;
/// Binds a network's `norm` key (batch | instance | none) onto `norm`.
void bind_norm(pipeline::OptionParser& p, NormKind& norm, const char* doc);

/// One size per spatial dim of a tensor, in tensor order ((Z, Y, X) in 3D, (Y, X) in 2D), or
/// one value for every dim. Converts from an integer, so `ConvOptions{3, 1, 8, 3, 2}` means
/// kernel 3 and stride 2 on every dim. (Configs write sizes in (x, y, z) order: AxisSizes in
/// models/nets/unet.hpp, whose dims() gives this.)
class DimSizes {
 public:
  DimSizes(int64_t value = 0) : values_{value} {}  // NOLINT(google-explicit-constructor)
  DimSizes(std::initializer_list<int64_t> values) : values_(values) {}
  explicit DimSizes(std::vector<int64_t> values) : values_(std::move(values)) {}

  /// The size on spatial dim d (a single value stands for every dim).
  int64_t operator[](size_t d) const { return values_.size() == 1 ? values_.front() : values_.at(d); }
  /// The sizes of `dims` spatial dims.
  std::vector<int64_t> expand(int dims) const;
  /// The values as given: one, or one per dim.
  const std::vector<int64_t>& values() const { return values_; }
  /// True when every dim has the size `v`.
  bool all_equal(int64_t v) const;
  /// "3" (the same on every dim) or "[1, 3, 3]".
  std::string text() const;

  /// Equal sizes on every dim (a single value compares as that value on every dim).
  friend bool operator==(const DimSizes& a, const DimSizes& b);
  friend bool operator==(const DimSizes& a, int64_t b) { return a.all_equal(b); }

 private:
  std::vector<int64_t> values_;
};

/// Writes text().
std::ostream& operator<<(std::ostream& stream, const DimSizes& sizes);

/// Options of ConvNd. Weight shape (out, in, k...) or, transposed, (in, out, k...). Sizes per
/// spatial dim in tensor order, or one for every dim.
struct ConvOptions {
  int spatial_dims = 3;         ///< 2 or 3
  int64_t in_channels = 1;      ///< >= 1
  int64_t out_channels = 1;     ///< >= 1
  DimSizes kernel_size = 3;     ///< >= 1 per dim
  DimSizes stride = 1;          ///< >= 1 per dim
  DimSizes padding = -1;        ///< voxels each side; -1 = "same" padding (kernel_size - 1) / 2 on that dim
  DimSizes output_padding = 0;  ///< transposed only; extra voxels on one side of the output
  bool transposed = false;      ///< transposed convolution (upsampling by `stride`)
  bool bias = true;             ///< learn an additive bias per output channel
};

/// A 2D or 3D (transposed) convolution, initialised like torch.nn.ConvNd
/// (kaiming_uniform(a=sqrt(5)), bias uniform(+-1/sqrt(fan_in))).
class ConvNdImpl : public torch::nn::Cloneable<ConvNdImpl> {
 public:
  explicit ConvNdImpl(ConvOptions options);
  void reset() override;
  void reset_parameters();
  /// The padding of each spatial dim, "same" (-1) resolved to (kernel_size - 1) / 2.
  std::vector<int64_t> resolved_padding() const;
  /// (N, in, *spatial) -> (N, out, *spatial').
  at::Tensor forward(const at::Tensor& x);
  void pretty_print(std::ostream& stream) const override;

  ConvOptions options;
  at::Tensor weight;
  at::Tensor bias;  ///< undefined when options.bias is false
};
TORCH_MODULE(ConvNd);

/// Batch or instance normalisation over (N, C, *spatial) for any number of spatial dims,
/// with PyTorch's parameter and buffer names. Instance norm uses per-sample statistics in
/// training and evaluation (track_running_stats off, as MONAI and nnU-Net use it).
struct NormOptions {
  NormKind kind = NormKind::batch;
  int64_t channels = 1;   ///< C
  double eps = 1e-5;      ///< added to the variance
  double momentum = 0.1;  ///< running statistics update (batch norm only)
  bool affine = true;     ///< learn weight and bias per channel
};

class NormImpl : public torch::nn::Cloneable<NormImpl> {
 public:
  explicit NormImpl(NormOptions options);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);
  void pretty_print(std::ostream& stream) const override;

  NormOptions options;
  at::Tensor weight, bias;                                    ///< when affine
  at::Tensor running_mean, running_var, num_batches_tracked;  ///< batch norm only
};
TORCH_MODULE(Norm);

/// Activation options; PReLU has one learned slope (torch.nn.PReLU default, init 0.25).
struct ActOptions {
  ActKind kind = ActKind::relu;
  double negative_slope = 0.01;  ///< LeakyReLU slope
  double prelu_init = 0.25;      ///< PReLU initial slope
};

class ActivationImpl : public torch::nn::Cloneable<ActivationImpl> {
 public:
  explicit ActivationImpl(ActOptions options);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);
  void pretty_print(std::ostream& stream) const override;

  ActOptions options;
  at::Tensor weight;  ///< PReLU slope, shape (1)
};
TORCH_MODULE(Activation);

/// Convolution followed by norm, dropout and activation (MONAI's Convolution with "NDA"
/// ordering; nnU-Net's ConvDropoutNormReLU when dropout is 0). conv_only skips all three.
struct ConvBlockOptions {
  ConvOptions conv;
  NormKind norm = NormKind::instance;
  ActOptions act = {ActKind::prelu};
  double dropout = 0.0;    ///< dropout probability in [0, 1)
  bool conv_only = false;  ///< no norm, dropout or activation (a final layer)
};

class ConvBlockImpl : public torch::nn::Cloneable<ConvBlockImpl> {
 public:
  explicit ConvBlockImpl(ConvBlockOptions options);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);
  void pretty_print(std::ostream& stream) const override;

  ConvBlockOptions options;
  ConvNd conv{nullptr};
  Norm norm{nullptr};       ///< null when conv_only or norm none
  Activation act{nullptr};  ///< null when conv_only or act none
};
TORCH_MODULE(ConvBlock);

/// Layer norm over the channel dim of (N, C, H, W), as SAM's LayerNorm2d (eps 1e-6).
class LayerNorm2dImpl : public torch::nn::Cloneable<LayerNorm2dImpl> {
 public:
  explicit LayerNorm2dImpl(int64_t channels, double eps = 1e-6);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);
  void pretty_print(std::ostream& stream) const override;

  int64_t channels;
  double eps;
  at::Tensor weight, bias;
};
TORCH_MODULE(LayerNorm2d);

/// After `copy = source.clone()`, gives each parameter of `copy` the requires_grad flag of
/// the same-named parameter of `source` (Cloneable::clone re-creates parameters in reset(),
/// which would otherwise unfreeze frozen sub-modules).
void mirror_requires_grad(const torch::nn::Module& source, torch::nn::Module& copy);

/// Sets requires_grad on every parameter of `module` (recursively).
void set_requires_grad(torch::nn::Module& module, bool requires_grad);

}  // namespace segflow::models
