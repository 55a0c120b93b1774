#pragma once
// Building blocks shared by the networks: a convolution that works in 2D and 3D (plain or
// transposed), batch/instance norm for either, activations, and SAM's LayerNorm2d.
// All are torch::nn::Cloneable with their parameters registered in reset(), so clone()
// (one copy per device) and state dicts behave like LibTorch's own modules. Parameter and
// buffer names follow PyTorch (weight, bias, running_mean, running_var, ...).

#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "messages/status.hpp"

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

/// Options of ConvNd. Weight shape (out, in, k...) or, transposed, (in, out, k...).
struct ConvOptions {
  int spatial_dims = 3;        ///< 2 or 3
  int64_t in_channels = 1;     ///< >= 1
  int64_t out_channels = 1;    ///< >= 1
  int64_t kernel_size = 3;     ///< same in every dim, >= 1
  int64_t stride = 1;          ///< same in every dim, >= 1
  int64_t padding = -1;        ///< voxels each side; -1 = "same" padding (kernel_size - 1) / 2
  int64_t output_padding = 0;  ///< transposed only; extra voxels on one side of the output
  bool transposed = false;     ///< transposed convolution (upsampling by `stride`)
  bool bias = true;            ///< learn an additive bias per output channel
};

/// A 2D or 3D (transposed) convolution, initialised like torch.nn.ConvNd
/// (kaiming_uniform(a=sqrt(5)), bias uniform(+-1/sqrt(fan_in))).
class ConvNdImpl : public torch::nn::Cloneable<ConvNdImpl> {
 public:
  explicit ConvNdImpl(ConvOptions options);
  void reset() override;
  void reset_parameters();
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
