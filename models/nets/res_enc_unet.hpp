#pragma once
// ResEncUNet (network "res_enc_unet"): nnU-Net's ResidualEncoderUNet (dynamic_network_architectures
// 0.4), the network of nnU-Net's residual encoder presets (nnUNetPlannerResEncM / L / XL). A
// stem (one conv block at stage 0's features), then per stage a stack of residual blocks
// (BasicBlockD: conv-norm-LeakyReLU, conv-norm, plus the input, LeakyReLU; the first block of
// a stage strided, its skip average-pooled by the stride and projected by a 1x1 conv-norm
// where the channels change), and the same plain decoder as PlainConvUNet (transposed conv,
// concatenated skip, conv blocks, deep supervision heads). Initialised as nnU-Net initialises
// it: He-normal convs (slope 1e-2), zero biases, and the last norm of every residual block at
// zero, so that each block starts as its skip.
//
// Its modules carry nnU-Net's names ("encoder.stem.convs.0.conv.weight",
// "encoder.stages.2.blocks.1.conv1.norm.bias", "encoder.stages.1.blocks.0.skip.1.conv.weight",
// "decoder.stages.0.convs.0.conv.weight", "decoder.transpconvs.0.weight",
// "decoder.seg_layers.0.bias"): a state_dict of nnU-Net's loads by name once its duplicate
// entries (all_modules.*, decoder.encoder.*) are dropped, and exports add them back.
// Sub-modules inside ModuleLists are looked up at forward time (see plain_unet.hpp).

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "messages/status.hpp"
#include "models/nets/plain_unet.hpp"

namespace segflow::models {

/// Options of ResEncUNet: the topology PlainConvUNet has, residual blocks per encoder stage,
/// and one decoder conv per stage by default (nnU-Net's ResEnc plans).
struct ResEncUNetOptions : ConvUNetTopology {
  /// Residual blocks per encoder stage (n_stages entries, each >= 1). Empty = nnU-Net's ResEnc
  /// planner's 1, 3, 4, 6, 6, 6, ... (the first n_stages).
  std::vector<int64_t> n_blocks_per_stage;

  ResEncUNetOptions() { n_conv_per_stage_decoder = 1; }
  Status validate() const;
  /// The blocks per stage (the default resolved).
  std::vector<int64_t> resolved_blocks() const;
};

/// nnU-Net's ResEnc planners' blocks per encoder stage: 1, 3, 4, 6, 6, 6, ... (n entries).
std::vector<int64_t> nnunet_resenc_blocks(int64_t n_stages);

/// A stack of conv blocks, nnU-Net's StackedConvBlocks (its ModuleList is `convs`).
class ConvStackImpl : public torch::nn::Cloneable<ConvStackImpl> {
 public:
  ConvStackImpl(std::vector<ConvBlockOptions> blocks);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);

  std::vector<ConvBlockOptions> blocks;
  torch::nn::ModuleList convs{nullptr};
};
TORCH_MODULE(ConvStack);

/// nnU-Net's BasicBlockD: relu(norm(conv(relu(norm(conv(x))))) + skip(x)), skip = identity, or
/// avg-pool by the stride (index 0) and/or a 1x1 conv-norm projection (the next index).
class ResBlockImpl : public torch::nn::Cloneable<ResBlockImpl> {
 public:
  ResBlockImpl(const ConvBlockOptions& conv1, double negative_slope);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);

  ConvBlockOptions conv1_options;  ///< the first conv block (stride, kernel, channels)
  double negative_slope;
  ConvBlock conv1{nullptr}, conv2{nullptr};
  torch::nn::ModuleList skip{nullptr};  ///< null: identity
  bool pooled = false;                  ///< skip[0] stands for the average pool
  bool projected = false;               ///< skip's last entry is the 1x1 conv block
};
TORCH_MODULE(ResBlock);

/// A stage of residual blocks, nnU-Net's StackedResidualBlocks (its ModuleList is `blocks`).
class ResStageImpl : public torch::nn::Cloneable<ResStageImpl> {
 public:
  ResStageImpl(std::vector<ConvBlockOptions> conv1s, double negative_slope);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);

  std::vector<ConvBlockOptions> conv1s;  ///< each block's first conv block
  double negative_slope;
  torch::nn::ModuleList blocks{nullptr};
};
TORCH_MODULE(ResStage);

/// nnU-Net's ResidualEncoder: `stem`, then `stages` (ResStages); forward returns every
/// stage's output (the skips, the bottleneck last).
class ResEncoderImpl : public torch::nn::Cloneable<ResEncoderImpl> {
 public:
  explicit ResEncoderImpl(ResEncUNetOptions options);
  void reset() override;
  std::vector<at::Tensor> forward(const at::Tensor& x);

  ResEncUNetOptions options;
  ConvStack stem{nullptr};
  torch::nn::ModuleList stages{nullptr};
};
TORCH_MODULE(ResEncoder);

/// nnU-Net's UNetDecoder over the skips of an encoder of this topology: `stages` (ConvStacks),
/// `transpconvs`, `seg_layers`; deepest first, as nnU-Net orders them.
class NnunetDecoderImpl : public torch::nn::Cloneable<NnunetDecoderImpl> {
 public:
  explicit NnunetDecoderImpl(ConvUNetTopology options);
  void reset() override;
  /// Logits, full resolution first.
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& skips);

  ConvUNetTopology options;
  torch::nn::ModuleList stages{nullptr}, transpconvs{nullptr}, seg_layers{nullptr};
};
TORCH_MODULE(NnunetDecoder);

/// nnU-Net's ResidualEncoderUNet. forward returns logits, full resolution first (one per
/// decoder stage with deep supervision).
class ResEncUNetImpl : public torch::nn::Cloneable<ResEncUNetImpl> {
 public:
  explicit ResEncUNetImpl(ResEncUNetOptions options);
  void reset() override;
  std::vector<at::Tensor> forward(const at::Tensor& x);
  void pretty_print(std::ostream& stream) const override;

  ResEncUNetOptions options;
  ResEncoder encoder{nullptr};
  NnunetDecoder decoder{nullptr};
};
TORCH_MODULE(ResEncUNet);

/// The row of "res_enc_unet" in the network table: its options binding, build, nnU-Net names
/// and PyTorch export (dynamic_network_architectures' ResidualEncoderUNet).
NetworkRow res_enc_unet_network();

/// Every name nnU-Net's ResidualEncoderUNet state_dict gives the segflow tensor `name` (its
/// own first, then the all_modules.* and decoder.encoder.* duplicates).
std::vector<std::string> nnunet_res_enc_names(const std::string& name);

}  // namespace segflow::models
