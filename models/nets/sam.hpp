#pragma once
// A MedSAM-style box-prompted 2D segmentation model, structured and named like Segment
// Anything (segment_anything/modeling): ImageEncoderViT, PromptEncoder (boxes only are fed;
// point, mask-input and "not a point" parameters exist so SAM/MedSAM checkpoints load
// strictly), MaskDecoder with a two-way transformer. Parameter names equal SAM's state dict
// keys (image_encoder.blocks.0.attn.qkv.weight, prompt_encoder.pe_layer.
// positional_encoding_gaussian_matrix, mask_decoder.transformer.layers.0.self_attn.q_proj.
// weight, ...), so a converted SAM/MedSAM checkpoint loads with an identity name map.
//
// Input: image (B, in_chans, H, W) float, normalised, H = W = img_size; boxes (B, 4) (or
// (B, 1, 4)) float x0, y0, x1, y1 in input pixel coordinates. Output: mask logits
// (B, 1, H, W): the decoder's low-resolution logits (B, 1, 4 H/patch, 4 W/patch; H/4 for
// patch 16) upsampled bilinearly (align_corners false), as MedSAM's forward.

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "messages/status.hpp"
#include "models/nets/layers.hpp"
#include "models/nets/network.hpp"

namespace segflow::models {

/// SAM's ImageEncoderViT options (defaults: ViT-B without windows and relative positions).
struct ImageEncoderOptions {
  int64_t img_size = 1024;  ///< input height = width, pixels; divisible by patch_size
  int64_t patch_size = 16;  ///< pixels per patch side
  int64_t in_chans = 3;     ///< image channels
  int64_t embed_dim = 768;  ///< token width; divisible by num_heads
  int64_t depth = 12;       ///< transformer blocks
  int64_t num_heads = 12;   ///< attention heads
  double mlp_ratio = 4.0;   ///< MLP hidden width / embed_dim
  int64_t out_chans = 256;  ///< neck output channels (= the decoder's transformer_dim)
  bool qkv_bias = true;
  bool use_abs_pos = true;                   ///< learned absolute positional embedding (1, h, w, embed_dim)
  bool use_rel_pos = false;                  ///< SAM's decomposed relative positions (rel_pos_h/w)
  int64_t window_size = 0;                   ///< windowed attention window (0 = global everywhere)
  std::vector<int64_t> global_attn_indexes;  ///< blocks with global attention when windowed
  bool frozen = false;                       ///< requires_grad false on every parameter
};

/// SAM's PromptEncoder options (derived from the encoder by SamOptions::resolve()).
struct PromptEncoderOptions {
  int64_t embed_dim = 256;            ///< = out_chans
  int64_t image_embedding_size = 64;  ///< img_size / patch_size
  int64_t input_image_size = 1024;    ///< img_size: box coordinates are divided by this
  int64_t mask_in_chans = 16;         ///< SAM's mask-downscaling width (unused by boxes)
  bool frozen = true;                 ///< MedSAM freezes the prompt encoder
};

/// SAM's MaskDecoder + TwoWayTransformer options.
struct MaskDecoderOptions {
  int64_t transformer_dim = 256;  ///< = out_chans; divisible by 8
  int64_t depth = 2;              ///< two-way attention blocks
  int64_t num_heads = 8;          ///< divides transformer_dim / attention_downsample_rate
  int64_t mlp_dim = 2048;         ///< two-way block MLP hidden width
  int64_t attention_downsample_rate = 2;
  int64_t num_multimask_outputs = 3;  ///< mask tokens = this + 1; output uses token 0
  bool iou_head = true;               ///< IoU prediction head (needed to load SAM weights)
  int64_t iou_head_depth = 3;
  int64_t iou_head_hidden_dim = 256;
  bool frozen = false;
};

/// Whole-model options. Build from a preset, adjust fields, call resolve() (SamImpl's
/// constructor resolves too).
struct SamOptions {
  ImageEncoderOptions image_encoder;
  PromptEncoderOptions prompt_encoder;
  MaskDecoderOptions mask_decoder;

  /// "tiny" (img 64, patch 8, embed 64, depth 2, heads 2, decoder dim 64: trains on a CPU in
  /// seconds), "small" (img 256, patch 16, embed 256, depth 4, heads 4, decoder dim 128),
  /// "vit_b" (SAM ViT-B: img 1024, patch 16, embed 768, depth 12, heads 12, window 14 with
  /// global blocks 2, 5, 8, 11, relative positions, decoder dim 256). Unknown names are an
  /// invalid_argument listing these.
  static Result<SamOptions> preset(const std::string& name);
  /// Names of the presets.
  static std::vector<std::string> preset_names();
  /// Copies the derived fields: prompt/decoder dims = out_chans, image_embedding_size =
  /// img_size / patch_size, input_image_size = img_size.
  void resolve();
  /// invalid_argument naming the bad field, or ok (call after resolve()).
  Status validate() const;
};

/// SAM's MLPBlock: lin1 -> activation -> lin2.
class MlpBlockImpl : public torch::nn::Cloneable<MlpBlockImpl> {
 public:
  MlpBlockImpl(int64_t embedding_dim, int64_t mlp_dim, ActKind act);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);
  int64_t embedding_dim, mlp_dim;
  ActKind act;
  torch::nn::Linear lin1{nullptr}, lin2{nullptr};
};
TORCH_MODULE(MlpBlock);

/// Multi-head self-attention of the ViT on (B, H, W, C) with optional decomposed relative
/// positional embeddings (SAM's image_encoder Attention).
class VitAttentionImpl : public torch::nn::Cloneable<VitAttentionImpl> {
 public:
  VitAttentionImpl(int64_t dim, int64_t num_heads, bool qkv_bias, bool use_rel_pos, int64_t input_size);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);
  int64_t dim, num_heads;
  bool qkv_bias, use_rel_pos;
  int64_t input_size;  ///< tokens per side the relative embeddings are sized for
  torch::nn::Linear qkv{nullptr}, proj{nullptr};
  at::Tensor rel_pos_h, rel_pos_w;
};
TORCH_MODULE(VitAttention);

/// Pre-norm transformer block (norm1, attn, norm2, mlp) with optional window partition.
class VitBlockImpl : public torch::nn::Cloneable<VitBlockImpl> {
 public:
  VitBlockImpl(const ImageEncoderOptions& o, int64_t window_size);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);
  ImageEncoderOptions options;
  int64_t window_size;
  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  VitAttention attn{nullptr};
  MlpBlock mlp{nullptr};
};
TORCH_MODULE(VitBlock);

/// Patch embedding: conv kernel = stride = patch_size, output (B, h, w, embed_dim).
class PatchEmbedImpl : public torch::nn::Cloneable<PatchEmbedImpl> {
 public:
  PatchEmbedImpl(int64_t patch_size, int64_t in_chans, int64_t embed_dim);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);
  int64_t patch_size, in_chans, embed_dim;
  ConvNd proj{nullptr};
};
TORCH_MODULE(PatchEmbed);

/// SAM's ImageEncoderViT: (B, in_chans, S, S) -> (B, out_chans, S/patch, S/patch).
class ImageEncoderViTImpl : public torch::nn::Cloneable<ImageEncoderViTImpl> {
 public:
  explicit ImageEncoderViTImpl(ImageEncoderOptions options);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);
  std::shared_ptr<torch::nn::Module> clone(
      const std::optional<torch::Device>& device = std::nullopt) const override;
  void pretty_print(std::ostream& stream) const override;
  ImageEncoderOptions options;
  PatchEmbed patch_embed{nullptr};
  at::Tensor pos_embed;                   ///< (1, h, w, embed_dim) when use_abs_pos
  torch::nn::ModuleList blocks{nullptr};  ///< VitBlocks
  torch::nn::Sequential neck{nullptr};    ///< conv1x1, LayerNorm2d, conv3x3, LayerNorm2d
};
TORCH_MODULE(ImageEncoderViT);

/// Random Fourier features of 2D coordinates in [0, 1]: [sin, cos](2 pi (2x - 1) G), G a
/// fixed (2, num_pos_feats) Gaussian buffer.
class PositionEmbeddingRandomImpl : public torch::nn::Cloneable<PositionEmbeddingRandomImpl> {
 public:
  explicit PositionEmbeddingRandomImpl(int64_t num_pos_feats, double scale = 1.0);
  void reset() override;
  /// Dense encoding of an (h, w) grid of cell centres: (2 num_pos_feats, h, w).
  at::Tensor forward(int64_t h, int64_t w);
  /// Coordinates (B, N, 2) as (x, y) pixels of an image of size (h, w) -> (B, N, 2 feats).
  at::Tensor forward_with_coords(const at::Tensor& coords, int64_t image_h, int64_t image_w);
  int64_t num_pos_feats;
  double scale;
  at::Tensor positional_encoding_gaussian_matrix;

 private:
  at::Tensor pe_encoding(const at::Tensor& coords) const;
};
TORCH_MODULE(PositionEmbeddingRandom);

/// The prompts of one SAM call (segment_anything's PromptEncoder.forward); an undefined tensor
/// is an absent prompt, and at least one must be given.
struct SamPrompts {
  at::Tensor points;  ///< (B, N, 2): (x, y) pixels of the model's input image
  at::Tensor labels;  ///< (B, N): 1 a positive click, 0 a negative one, -1 padding (no point)
  at::Tensor boxes;   ///< (B, 4) or (B, 1, 4): x0, y0, x1, y1 pixels
  at::Tensor masks;   ///< (B, 1, 4h, 4w): low-resolution logits, e.g. the previous prediction
};

/// SAM's PromptEncoder: points, a box and a low-resolution mask into sparse (B, T, embed_dim)
/// tokens and a dense (B, embed_dim, h, w) embedding, as segment_anything computes them.
class PromptEncoderImpl : public torch::nn::Cloneable<PromptEncoderImpl> {
 public:
  explicit PromptEncoderImpl(PromptEncoderOptions options);
  void reset() override;
  /// boxes (B, 4) or (B, 1, 4) -> {sparse (B, 2, D), dense (B, D, h, w)}.
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& boxes);
  /// Any mix of prompts -> {sparse (B, N [+ 1 padding point without a box] [+ 2 box corners], D),
  /// dense (B, D, h, w): the mask's downscaled embedding, or "no mask"}.
  std::pair<at::Tensor, at::Tensor> encode(const SamPrompts& prompts);
  /// Positional encoding of the image embedding grid: (1, D, h, w).
  at::Tensor get_dense_pe();
  std::shared_ptr<torch::nn::Module> clone(
      const std::optional<torch::Device>& device = std::nullopt) const override;
  void pretty_print(std::ostream& stream) const override;
  PromptEncoderOptions options;
  PositionEmbeddingRandom pe_layer{nullptr};
  torch::nn::ModuleList point_embeddings{nullptr};  ///< 4 x Embedding(1, D): pos, neg, corner 0, 1
  torch::nn::Embedding not_a_point_embed{nullptr};
  torch::nn::Sequential mask_downscaling{nullptr};  ///< a mask prompt (B, 1, 4h, 4w) -> (B, D, h, w)
  torch::nn::Embedding no_mask_embed{nullptr};
};
TORCH_MODULE(PromptEncoder);

/// Attention with q/k/v/out projections and an internal width dim / downsample_rate
/// (SAM's transformer Attention).
class TokenAttentionImpl : public torch::nn::Cloneable<TokenAttentionImpl> {
 public:
  TokenAttentionImpl(int64_t embedding_dim, int64_t num_heads, int64_t downsample_rate = 1);
  void reset() override;
  at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);
  int64_t embedding_dim, num_heads, downsample_rate;
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, out_proj{nullptr};
};
TORCH_MODULE(TokenAttention);

/// Token self-attention, token->image and image->token cross-attention, MLP on tokens.
class TwoWayAttentionBlockImpl : public torch::nn::Cloneable<TwoWayAttentionBlockImpl> {
 public:
  TwoWayAttentionBlockImpl(const MaskDecoderOptions& o, bool skip_first_layer_pe);
  void reset() override;
  /// -> {queries, keys}.
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& queries, const at::Tensor& keys,
                                            const at::Tensor& query_pe, const at::Tensor& key_pe);
  MaskDecoderOptions options;
  bool skip_first_layer_pe;
  TokenAttention self_attn{nullptr}, cross_attn_token_to_image{nullptr}, cross_attn_image_to_token{nullptr};
  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr}, norm3{nullptr}, norm4{nullptr};
  MlpBlock mlp{nullptr};
};
TORCH_MODULE(TwoWayAttentionBlock);

class TwoWayTransformerImpl : public torch::nn::Cloneable<TwoWayTransformerImpl> {
 public:
  explicit TwoWayTransformerImpl(MaskDecoderOptions options);
  void reset() override;
  /// image (B, C, h, w), image_pe (B, C, h, w), tokens (B, T, C) -> {tokens, image (B, hw, C)}.
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& image, const at::Tensor& image_pe,
                                            const at::Tensor& tokens);
  MaskDecoderOptions options;
  torch::nn::ModuleList layers{nullptr};
  TokenAttention final_attn_token_to_image{nullptr};
  torch::nn::LayerNorm norm_final_attn{nullptr};
};
TORCH_MODULE(TwoWayTransformer);

/// SAM's MLP: num_layers linears with ReLU between.
class HyperMlpImpl : public torch::nn::Cloneable<HyperMlpImpl> {
 public:
  HyperMlpImpl(int64_t input_dim, int64_t hidden_dim, int64_t output_dim, int64_t num_layers);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);
  int64_t input_dim, hidden_dim, output_dim, num_layers;
  torch::nn::ModuleList layers{nullptr};
};
TORCH_MODULE(HyperMlp);

/// Output of the mask decoder / whole model.
struct SamOutput {
  at::Tensor masks;             ///< (B, M, H, W) logits at input resolution; M = 1, or 3 multimask
  at::Tensor low_res_masks;     ///< (B, M, 4h, 4w) logits
  at::Tensor iou_predictions;   ///< (B, M); undefined without the IoU head
  at::Tensor image_embeddings;  ///< (B, out_chans, S/patch, S/patch): the image encoder's output
};

class MaskDecoderImpl : public torch::nn::Cloneable<MaskDecoderImpl> {
 public:
  explicit MaskDecoderImpl(MaskDecoderOptions options);
  void reset() override;
  /// image_embeddings (B, C, h, w), image_pe (1, C, h, w), sparse (B, T, C), dense
  /// (B, C, h, w) -> {low-res masks (B, 1, 4h, 4w) from mask token 0, iou (B, 1) or undefined};
  /// `multimask`: the masks of the other tokens instead, (B, num_multimask_outputs, 4h, 4w) and
  /// their IoU predictions (SAM's answer to an ambiguous prompt such as one click).
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& image_embeddings, const at::Tensor& image_pe,
                                            const at::Tensor& sparse, const at::Tensor& dense,
                                            bool multimask = false);
  std::shared_ptr<torch::nn::Module> clone(
      const std::optional<torch::Device>& device = std::nullopt) const override;
  void pretty_print(std::ostream& stream) const override;
  MaskDecoderOptions options;
  TwoWayTransformer transformer{nullptr};
  torch::nn::Embedding iou_token{nullptr}, mask_tokens{nullptr};
  torch::nn::Sequential output_upscaling{nullptr};
  torch::nn::ModuleList output_hypernetworks_mlps{nullptr};
  HyperMlp iou_prediction_head{nullptr};  ///< null without the IoU head
};
TORCH_MODULE(MaskDecoder);

/// The box-prompted model (MedSAM's forward). clone() keeps frozen parts frozen.
class SamImpl : public torch::nn::Cloneable<SamImpl> {
 public:
  explicit SamImpl(SamOptions options);
  void reset() override;
  /// image (B, C, S, S), boxes (B, 4) -> mask logits (B, 1, S, S).
  at::Tensor forward(const at::Tensor& image, const at::Tensor& boxes);
  /// As forward, with the low-resolution logits and IoU predictions.
  SamOutput forward_full(const at::Tensor& image, const at::Tensor& boxes);
  /// Any mix of point, box and mask prompts (one prompt set per image); with `multimask`
  /// the num_multimask_outputs candidate masks and their IoU predictions.
  SamOutput forward_prompts(const at::Tensor& image, const SamPrompts& prompts, bool multimask = false);
  std::shared_ptr<torch::nn::Module> clone(
      const std::optional<torch::Device>& device = std::nullopt) const override;
  void pretty_print(std::ostream& stream) const override;
  SamOptions options;
  ImageEncoderViT image_encoder{nullptr};
  PromptEncoder prompt_encoder{nullptr};
  MaskDecoder mask_decoder{nullptr};
};
TORCH_MODULE(Sam);

/// SAM as a config names it: a preset and the options it resolved to after the keys that
/// override it field by field.
struct SamModelOptions {
  std::string preset = "tiny";                          ///< tiny | small | vit_b
  SamOptions sam = SamOptions::preset("tiny").value();  ///< the preset with overrides, resolved
};

/// The row of "sam" in the network table (models/nets/registry.cpp): its options binding
/// (a preset, then keys that override it), build and PyTorch export (segment_anything's Sam).
NetworkRow sam_network();

}  // namespace segflow::models
