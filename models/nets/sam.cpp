#include "models/nets/sam.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <ostream>

#include "pipeline/options.hpp"

namespace segflow::models {
namespace F = torch::nn::functional;

// ----------------------------------------------------------------------------- SamOptions

std::vector<std::string> SamOptions::preset_names() { return {"tiny", "small", "vit_b"}; }

Result<SamOptions> SamOptions::preset(const std::string& name) {
  SamOptions o;
  auto& e = o.image_encoder;
  auto& d = o.mask_decoder;
  if (name == "tiny") {
    e.img_size = 64, e.patch_size = 8, e.embed_dim = 64, e.depth = 2, e.num_heads = 2, e.out_chans = 64;
    d.depth = 2, d.num_heads = 2, d.mlp_dim = 128, d.num_multimask_outputs = 0, d.iou_head = false;
    d.iou_head_hidden_dim = 64;
  } else if (name == "small") {
    e.img_size = 256, e.patch_size = 16, e.embed_dim = 256, e.depth = 4, e.num_heads = 4, e.out_chans = 128;
    d.depth = 2, d.num_heads = 4, d.mlp_dim = 512, d.iou_head_hidden_dim = 128;
  } else if (name == "vit_b") {
    e.img_size = 1024, e.patch_size = 16, e.embed_dim = 768, e.depth = 12, e.num_heads = 12,
    e.out_chans = 256;
    e.use_rel_pos = true, e.window_size = 14, e.global_attn_indexes = {2, 5, 8, 11};
    d.depth = 2, d.num_heads = 8, d.mlp_dim = 2048, d.iou_head_hidden_dim = 256;
  } else {
    return invalid_argument("sam: preset: expected one of tiny, small, vit_b, got '" + name + "'");
  }
  o.resolve();
  return o;
}

void SamOptions::resolve() {
  const auto& e = image_encoder;
  prompt_encoder.embed_dim = e.out_chans;
  prompt_encoder.image_embedding_size = e.patch_size > 0 ? e.img_size / e.patch_size : 0;
  prompt_encoder.input_image_size = e.img_size;
  mask_decoder.transformer_dim = e.out_chans;
}

Status SamOptions::validate() const {
  auto bad = [](const std::string& field, const std::string& expected, const std::string& got) {
    return invalid_argument("sam: " + field + ": expected " + expected + ", got " + got);
  };
  const auto& e = image_encoder;
  const auto& d = mask_decoder;
  using std::to_string;
  if (e.patch_size < 1) return bad("patch_size", ">= 1", to_string(e.patch_size));
  if (e.img_size < e.patch_size || e.img_size % e.patch_size != 0)
    return bad("img_size", "a multiple of patch_size " + to_string(e.patch_size), to_string(e.img_size));
  if (e.in_chans < 1) return bad("in_channels", ">= 1", to_string(e.in_chans));
  if (e.num_heads < 1) return bad("num_heads", ">= 1", to_string(e.num_heads));
  if (e.embed_dim < 1 || e.embed_dim % e.num_heads != 0)
    return bad("embed_dim", "a positive multiple of num_heads " + to_string(e.num_heads),
               to_string(e.embed_dim));
  if (e.depth < 1) return bad("depth", ">= 1", to_string(e.depth));
  if (!(e.mlp_ratio > 0)) return bad("mlp_ratio", "> 0", to_string(e.mlp_ratio));
  if (e.out_chans < 8 || e.out_chans % 8 != 0)
    return bad("out_chans", "a positive multiple of 8", to_string(e.out_chans));
  if (e.window_size < 0) return bad("window_size", ">= 0", to_string(e.window_size));
  for (auto i : e.global_attn_indexes)
    if (i < 0 || i >= e.depth) return bad("global_attn_indexes", "block indexes in [0, depth)", to_string(i));
  if (d.depth < 1) return bad("decoder_depth", ">= 1", to_string(d.depth));
  if (d.attention_downsample_rate < 1 || d.transformer_dim % d.attention_downsample_rate != 0)
    return bad("attention_downsample_rate", "a divisor of out_chans", to_string(d.attention_downsample_rate));
  if (d.num_heads < 1 || d.transformer_dim % d.num_heads != 0 ||
      (d.transformer_dim / d.attention_downsample_rate) % d.num_heads != 0)
    return bad("decoder_heads", "a divisor of out_chans / attention_downsample_rate", to_string(d.num_heads));
  if (d.mlp_dim < 1) return bad("decoder_mlp_dim", ">= 1", to_string(d.mlp_dim));
  if (d.num_multimask_outputs < 0)
    return bad("num_multimask_outputs", ">= 0", to_string(d.num_multimask_outputs));
  if (d.iou_head && (d.iou_head_depth < 1 || d.iou_head_hidden_dim < 1))
    return bad("iou_head_depth", ">= 1 with hidden dim >= 1", to_string(d.iou_head_depth));
  if (prompt_encoder.mask_in_chans < 4 || prompt_encoder.mask_in_chans % 4 != 0)
    return bad("mask_in_chans", "a positive multiple of 4", to_string(prompt_encoder.mask_in_chans));
  if (prompt_encoder.embed_dim != e.out_chans || d.transformer_dim != e.out_chans ||
      prompt_encoder.image_embedding_size * e.patch_size != e.img_size)
    return bad("options", "resolved options (call SamOptions::resolve())", "inconsistent sizes");
  return Status::ok();
}

// -------------------------------------------------------------------------------- MlpBlock

MlpBlockImpl::MlpBlockImpl(int64_t e, int64_t m, ActKind a) : embedding_dim(e), mlp_dim(m), act(a) {
  reset();
}

void MlpBlockImpl::reset() {
  lin1 = register_module("lin1", torch::nn::Linear(embedding_dim, mlp_dim));
  lin2 = register_module("lin2", torch::nn::Linear(mlp_dim, embedding_dim));
}

at::Tensor MlpBlockImpl::forward(const at::Tensor& x) {
  auto h = lin1->forward(x);
  h = act == ActKind::gelu ? at::gelu(h) : at::relu(h);
  return lin2->forward(h);
}

// ---------------------------------------------------------------------------- VitAttention

namespace {

// Relative positional embeddings for q_size == k_size == size: (size, size, head_dim),
// resizing the table linearly when it was trained for another size (SAM's get_rel_pos).
at::Tensor get_rel_pos(int64_t size, const at::Tensor& rel_pos) {
  const int64_t max_rel_dist = 2 * size - 1;
  at::Tensor table = rel_pos;
  if (rel_pos.size(0) != max_rel_dist) {
    auto t = rel_pos.reshape({1, rel_pos.size(0), -1}).permute({0, 2, 1});
    t = F::interpolate(t, F::InterpolateFuncOptions()
                              .size(std::vector<int64_t>{max_rel_dist})
                              .mode(torch::kLinear)
                              .align_corners(false));
    table = t.reshape({-1, max_rel_dist}).permute({1, 0});
  }
  auto coords = torch::arange(size, torch::TensorOptions().dtype(torch::kLong).device(rel_pos.device()));
  auto idx = coords.unsqueeze(1) - coords.unsqueeze(0) + (size - 1);
  return table.index({idx});
}

}  // namespace

VitAttentionImpl::VitAttentionImpl(int64_t d, int64_t h, bool qb, bool rel, int64_t in)
    : dim(d), num_heads(h), qkv_bias(qb), use_rel_pos(rel), input_size(in) {
  reset();
}

void VitAttentionImpl::reset() {
  qkv = register_module("qkv", torch::nn::Linear(torch::nn::LinearOptions(dim, 3 * dim).bias(qkv_bias)));
  proj = register_module("proj", torch::nn::Linear(dim, dim));
  if (use_rel_pos) {
    const int64_t head_dim = dim / num_heads;
    rel_pos_h = register_parameter("rel_pos_h", torch::zeros({2 * input_size - 1, head_dim}));
    rel_pos_w = register_parameter("rel_pos_w", torch::zeros({2 * input_size - 1, head_dim}));
  }
}

at::Tensor VitAttentionImpl::forward(const at::Tensor& x) {
  const int64_t B = x.size(0), H = x.size(1), W = x.size(2);
  auto qkv_t = qkv->forward(x).reshape({B, H * W, 3, num_heads, -1}).permute({2, 0, 3, 1, 4});
  auto q = qkv_t[0], k = qkv_t[1], v = qkv_t[2];  // (B, heads, HW, d)
  std::optional<at::Tensor> bias;
  if (use_rel_pos) {
    const int64_t d = q.size(-1);
    auto rh = get_rel_pos(H, rel_pos_h);  // (H, H, d)
    auto rw = get_rel_pos(W, rel_pos_w);  // (W, W, d)
    auto r_q = q.reshape({B * num_heads, H, W, d});
    auto rel_h = torch::einsum("bhwc,hkc->bhwk", {r_q, rh});
    auto rel_w = torch::einsum("bhwc,wkc->bhwk", {r_q, rw});
    bias = (rel_h.unsqueeze(-1) + rel_w.unsqueeze(-2)).reshape({B, num_heads, H * W, H * W});
  }
  auto out = at::scaled_dot_product_attention(q, k, v, bias);  // scale 1/sqrt(d)
  out = out.view({B, num_heads, H, W, -1}).permute({0, 2, 3, 1, 4}).reshape({B, H, W, -1});
  return proj->forward(out);
}

// -------------------------------------------------------------------------------- VitBlock

namespace {

std::pair<at::Tensor, std::pair<int64_t, int64_t>> window_partition(const at::Tensor& x, int64_t ws) {
  const int64_t B = x.size(0), H = x.size(1), W = x.size(2), C = x.size(3);
  const int64_t pad_h = (ws - H % ws) % ws, pad_w = (ws - W % ws) % ws;
  at::Tensor t = x;
  if (pad_h > 0 || pad_w > 0) t = F::pad(x, F::PadFuncOptions({0, 0, 0, pad_w, 0, pad_h}));
  const int64_t Hp = H + pad_h, Wp = W + pad_w;
  t = t.view({B, Hp / ws, ws, Wp / ws, ws, C}).permute({0, 1, 3, 2, 4, 5}).contiguous().view({-1, ws, ws, C});
  return {t, {Hp, Wp}};
}

at::Tensor window_unpartition(const at::Tensor& windows, int64_t ws, std::pair<int64_t, int64_t> pad_hw,
                              int64_t H, int64_t W) {
  const auto [Hp, Wp] = pad_hw;
  const int64_t B = windows.size(0) / (Hp * Wp / ws / ws);
  auto x = windows.view({B, Hp / ws, Wp / ws, ws, ws, -1})
               .permute({0, 1, 3, 2, 4, 5})
               .contiguous()
               .view({B, Hp, Wp, -1});
  if (Hp > H || Wp > W) {
    using torch::indexing::Slice;
    x = x.index({Slice(), Slice(0, H), Slice(0, W), Slice()}).contiguous();
  }
  return x;
}

}  // namespace

VitBlockImpl::VitBlockImpl(const ImageEncoderOptions& o, int64_t ws) : options(o), window_size(ws) {
  reset();
}

void VitBlockImpl::reset() {
  const auto& o = options;
  const int64_t grid = o.img_size / o.patch_size;
  norm1 =
      register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.embed_dim}).eps(1e-6)));
  attn = register_module("attn", VitAttention(o.embed_dim, o.num_heads, o.qkv_bias, o.use_rel_pos,
                                              window_size > 0 ? window_size : grid));
  norm2 =
      register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.embed_dim}).eps(1e-6)));
  mlp = register_module(
      "mlp", MlpBlock(o.embed_dim, static_cast<int64_t>(o.embed_dim * o.mlp_ratio), ActKind::gelu));
}

at::Tensor VitBlockImpl::forward(const at::Tensor& x) {
  auto h = norm1->forward(x);
  if (window_size > 0) {
    const int64_t H = h.size(1), W = h.size(2);
    auto [w, pad_hw] = window_partition(h, window_size);
    h = window_unpartition(attn->forward(w), window_size, pad_hw, H, W);
  } else {
    h = attn->forward(h);
  }
  auto y = x + h;
  return y + mlp->forward(norm2->forward(y));
}

// ------------------------------------------------------------------------------ PatchEmbed

PatchEmbedImpl::PatchEmbedImpl(int64_t p, int64_t c, int64_t e) : patch_size(p), in_chans(c), embed_dim(e) {
  reset();
}

void PatchEmbedImpl::reset() {
  proj = register_module("proj", ConvNd(ConvOptions{2, in_chans, embed_dim, patch_size, patch_size, 0}));
}

at::Tensor PatchEmbedImpl::forward(const at::Tensor& x) { return proj->forward(x).permute({0, 2, 3, 1}); }

// ------------------------------------------------------------------------- ImageEncoderViT

ImageEncoderViTImpl::ImageEncoderViTImpl(ImageEncoderOptions o) : options(std::move(o)) { reset(); }

void ImageEncoderViTImpl::reset() {
  const auto& o = options;
  const int64_t grid = o.img_size / o.patch_size;
  patch_embed = register_module("patch_embed", PatchEmbed(o.patch_size, o.in_chans, o.embed_dim));
  pos_embed = o.use_abs_pos ? register_parameter("pos_embed", torch::zeros({1, grid, grid, o.embed_dim}))
                            : at::Tensor();
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.depth; ++i) {
    bool global = false;
    for (auto g : o.global_attn_indexes) global = global || g == i;
    blocks->push_back(VitBlock(o, global ? 0 : o.window_size));
  }
  neck = register_module(
      "neck",
      torch::nn::Sequential(ConvNd(ConvOptions{2, o.embed_dim, o.out_chans, 1, 1, 0, 0, false, false}),
                            LayerNorm2d(o.out_chans),
                            ConvNd(ConvOptions{2, o.out_chans, o.out_chans, 3, 1, 1, 0, false, false}),
                            LayerNorm2d(o.out_chans)));
  if (o.frozen) set_requires_grad(*this, false);
}

at::Tensor ImageEncoderViTImpl::forward(const at::Tensor& x) {
  const auto& o = options;
  TORCH_CHECK(x.dim() == 4 && x.size(1) == o.in_chans && x.size(2) == o.img_size && x.size(3) == o.img_size,
              "ImageEncoderViT: expected an image (B, ", o.in_chans, ", ", o.img_size, ", ", o.img_size,
              "), got shape ", x.sizes());
  auto h = patch_embed->forward(x);
  if (pos_embed.defined()) h = h + pos_embed;
  for (size_t i = 0; i < blocks->size(); ++i) h = blocks->at<VitBlockImpl>(i).forward(h);
  return neck->forward(h.permute({0, 3, 1, 2}));
}

std::shared_ptr<torch::nn::Module> ImageEncoderViTImpl::clone(
    const std::optional<torch::Device>& device) const {
  auto copy = Cloneable<ImageEncoderViTImpl>::clone(device);
  mirror_requires_grad(*this, *copy);
  return copy;
}

void ImageEncoderViTImpl::pretty_print(std::ostream& s) const {
  const auto& o = options;
  s << "segflow::models::ImageEncoderViT(img_size=" << o.img_size << ", patch_size=" << o.patch_size
    << ", embed_dim=" << o.embed_dim << ", depth=" << o.depth << ", num_heads=" << o.num_heads
    << ", out_chans=" << o.out_chans << ", window_size=" << o.window_size
    << ", use_rel_pos=" << (o.use_rel_pos ? "true" : "false") << (o.frozen ? ", frozen" : "") << ")";
}

// ----------------------------------------------------------------- PositionEmbeddingRandom

PositionEmbeddingRandomImpl::PositionEmbeddingRandomImpl(int64_t n, double s) : num_pos_feats(n), scale(s) {
  reset();
}

void PositionEmbeddingRandomImpl::reset() {
  const double sc = scale > 0.0 ? scale : 1.0;
  positional_encoding_gaussian_matrix =
      register_buffer("positional_encoding_gaussian_matrix", sc * torch::randn({2, num_pos_feats}));
}

at::Tensor PositionEmbeddingRandomImpl::pe_encoding(const at::Tensor& coords) const {
  auto c = (2 * coords - 1).matmul(positional_encoding_gaussian_matrix) * (2 * M_PI);
  return torch::cat({torch::sin(c), torch::cos(c)}, -1);
}

at::Tensor PositionEmbeddingRandomImpl::forward(int64_t h, int64_t w) {
  auto opts = positional_encoding_gaussian_matrix.options();
  auto grid = torch::ones({h, w}, opts);
  auto y = (grid.cumsum(0) - 0.5) / static_cast<double>(h);
  auto x = (grid.cumsum(1) - 0.5) / static_cast<double>(w);
  return pe_encoding(torch::stack({x, y}, -1)).permute({2, 0, 1});
}

at::Tensor PositionEmbeddingRandomImpl::forward_with_coords(const at::Tensor& coords, int64_t image_h,
                                                            int64_t image_w) {
  auto scale_xy = torch::tensor({1.0 / static_cast<double>(image_w), 1.0 / static_cast<double>(image_h)},
                                positional_encoding_gaussian_matrix.options());
  return pe_encoding(coords.to(positional_encoding_gaussian_matrix.scalar_type()) * scale_xy);
}

// --------------------------------------------------------------------------- PromptEncoder

PromptEncoderImpl::PromptEncoderImpl(PromptEncoderOptions o) : options(std::move(o)) { reset(); }

void PromptEncoderImpl::reset() {
  const auto& o = options;
  const int64_t D = o.embed_dim, m = o.mask_in_chans;
  pe_layer = register_module("pe_layer", PositionEmbeddingRandom(D / 2));
  point_embeddings = register_module("point_embeddings", torch::nn::ModuleList());
  for (int i = 0; i < 4; ++i) point_embeddings->push_back(torch::nn::Embedding(1, D));
  not_a_point_embed = register_module("not_a_point_embed", torch::nn::Embedding(1, D));
  mask_downscaling = register_module(
      "mask_downscaling",
      torch::nn::Sequential(ConvNd(ConvOptions{2, 1, m / 4, 2, 2, 0}), LayerNorm2d(m / 4), torch::nn::GELU(),
                            ConvNd(ConvOptions{2, m / 4, m, 2, 2, 0}), LayerNorm2d(m), torch::nn::GELU(),
                            ConvNd(ConvOptions{2, m, D, 1, 1, 0})));
  no_mask_embed = register_module("no_mask_embed", torch::nn::Embedding(1, D));
  if (o.frozen) set_requires_grad(*this, false);
}

std::pair<at::Tensor, at::Tensor> PromptEncoderImpl::forward(const at::Tensor& boxes) {
  TORCH_CHECK((boxes.dim() == 2 && boxes.size(1) == 4) ||
                  (boxes.dim() == 3 && boxes.size(1) == 1 && boxes.size(2) == 4),
              "PromptEncoder: expected boxes (B, 4) or (B, 1, 4), got shape ", boxes.sizes());
  return encode({.boxes = boxes});
}

std::pair<at::Tensor, at::Tensor> PromptEncoderImpl::encode(const SamPrompts& p) {
  const auto& o = options;
  const bool has_points = p.points.defined(), has_box = p.boxes.defined(), has_mask = p.masks.defined();
  TORCH_CHECK(has_points || has_box || has_mask, "PromptEncoder: expected a point, box or mask prompt");
  const int64_t B = has_points ? p.points.size(0) : has_box ? p.boxes.size(0) : p.masks.size(0);
  auto dev = pe_layer->positional_encoding_gaussian_matrix.device();
  auto weight = [this](int i) { return point_embeddings->at<torch::nn::EmbeddingImpl>(i).weight; };
  std::vector<at::Tensor> sparse;
  if (has_points) {
    TORCH_CHECK(p.points.dim() == 3 && p.points.size(2) == 2 && p.labels.defined() &&
                    p.labels.sizes() == p.points.sizes().slice(0, 2),
                "PromptEncoder: expected points (B, N, 2) with labels (B, N), got shapes ", p.points.sizes(),
                " and ", p.labels.defined() ? p.labels.sizes() : at::IntArrayRef{});
    at::Tensor coords = p.points.to(dev, torch::kFloat) + 0.5;  // centre of the pixel
    at::Tensor labels = p.labels.to(dev, torch::kFloat);
    if (!has_box) {  // SAM pads a point set without a box with one "not a point"
      coords = torch::cat({coords, torch::zeros({B, 1, 2}, coords.options())}, 1);
      labels = torch::cat({labels, -torch::ones({B, 1}, labels.options())}, 1);
    }
    at::Tensor e = pe_layer->forward_with_coords(coords, o.input_image_size, o.input_image_size);
    const auto is = [&labels](double v) { return (labels == v).unsqueeze(-1).to(torch::kFloat); };
    // Padding: the not-a-point embedding alone; a click: its position plus its label's embedding.
    e = e * (1 - is(-1)) + is(-1) * not_a_point_embed->weight + is(0) * weight(0) + is(1) * weight(1);
    sparse.push_back(e);
  }
  if (has_box) {
    auto coords = (p.boxes.to(dev, torch::kFloat).reshape({B, 2, 2}) + 0.5);  // centre of the pixel
    auto corner = pe_layer->forward_with_coords(coords, o.input_image_size, o.input_image_size);
    sparse.push_back(corner + torch::cat({weight(2), weight(3)}, 0).unsqueeze(0));
  }
  at::Tensor tokens = sparse.size() == 1 ? sparse.front()
                      : sparse.empty() ? torch::zeros({B, 0, o.embed_dim}, torch::TensorOptions().device(dev))
                                       : torch::cat(sparse, 1);
  const int64_t s = o.image_embedding_size;
  if (has_mask) {
    TORCH_CHECK(
        p.masks.dim() == 4 && p.masks.size(1) == 1 && p.masks.size(2) == 4 * s && p.masks.size(3) == 4 * s,
        "PromptEncoder: expected a mask prompt (B, 1, ", 4 * s, ", ", 4 * s, "), got shape ",
        p.masks.sizes());
    return {tokens, mask_downscaling->forward(p.masks.to(dev, torch::kFloat))};
  }
  return {tokens, no_mask_embed->weight.reshape({1, -1, 1, 1}).expand({B, -1, s, s})};
}

at::Tensor PromptEncoderImpl::get_dense_pe() {
  return pe_layer->forward(options.image_embedding_size, options.image_embedding_size).unsqueeze(0);
}

std::shared_ptr<torch::nn::Module> PromptEncoderImpl::clone(
    const std::optional<torch::Device>& device) const {
  auto copy = Cloneable<PromptEncoderImpl>::clone(device);
  mirror_requires_grad(*this, *copy);
  return copy;
}

void PromptEncoderImpl::pretty_print(std::ostream& s) const {
  s << "segflow::models::PromptEncoder(embed_dim=" << options.embed_dim
    << ", image_embedding_size=" << options.image_embedding_size
    << ", input_image_size=" << options.input_image_size << (options.frozen ? ", frozen" : "") << ")";
}

// -------------------------------------------------------------------------- TokenAttention

TokenAttentionImpl::TokenAttentionImpl(int64_t e, int64_t h, int64_t r)
    : embedding_dim(e), num_heads(h), downsample_rate(r) {
  reset();
}

void TokenAttentionImpl::reset() {
  const int64_t internal = embedding_dim / downsample_rate;
  TORCH_CHECK(internal % num_heads == 0,
              "TokenAttention: num_heads must divide embedding_dim / downsample_rate");
  q_proj = register_module("q_proj", torch::nn::Linear(embedding_dim, internal));
  k_proj = register_module("k_proj", torch::nn::Linear(embedding_dim, internal));
  v_proj = register_module("v_proj", torch::nn::Linear(embedding_dim, internal));
  out_proj = register_module("out_proj", torch::nn::Linear(internal, embedding_dim));
}

at::Tensor TokenAttentionImpl::forward(const at::Tensor& q_in, const at::Tensor& k_in,
                                       const at::Tensor& v_in) {
  auto heads = [&](const at::Tensor& t) {  // (B, N, C) -> (B, heads, N, C / heads)
    return t.reshape({t.size(0), t.size(1), num_heads, t.size(2) / num_heads}).transpose(1, 2);
  };
  auto q = heads(q_proj->forward(q_in)), k = heads(k_proj->forward(k_in)), v = heads(v_proj->forward(v_in));
  auto out = at::scaled_dot_product_attention(q, k, v);  // softmax(q k^T / sqrt(c)) v
  out = out.transpose(1, 2).reshape({out.size(0), out.size(2), -1});
  return out_proj->forward(out);
}

// -------------------------------------------------------------------- TwoWayAttentionBlock

TwoWayAttentionBlockImpl::TwoWayAttentionBlockImpl(const MaskDecoderOptions& o, bool skip)
    : options(o), skip_first_layer_pe(skip) {
  reset();
}

void TwoWayAttentionBlockImpl::reset() {
  const auto& o = options;
  const int64_t D = o.transformer_dim;
  auto ln = [&] { return torch::nn::LayerNorm(torch::nn::LayerNormOptions({D})); };
  self_attn = register_module("self_attn", TokenAttention(D, o.num_heads));
  norm1 = register_module("norm1", ln());
  cross_attn_token_to_image = register_module("cross_attn_token_to_image",
                                              TokenAttention(D, o.num_heads, o.attention_downsample_rate));
  norm2 = register_module("norm2", ln());
  mlp = register_module("mlp", MlpBlock(D, o.mlp_dim, ActKind::relu));
  norm3 = register_module("norm3", ln());
  norm4 = register_module("norm4", ln());
  cross_attn_image_to_token = register_module("cross_attn_image_to_token",
                                              TokenAttention(D, o.num_heads, o.attention_downsample_rate));
}

std::pair<at::Tensor, at::Tensor> TwoWayAttentionBlockImpl::forward(const at::Tensor& queries_in,
                                                                    const at::Tensor& keys_in,
                                                                    const at::Tensor& query_pe,
                                                                    const at::Tensor& key_pe) {
  at::Tensor queries, keys = keys_in;
  if (skip_first_layer_pe) {
    queries = self_attn->forward(queries_in, queries_in, queries_in);
  } else {
    auto q = queries_in + query_pe;
    queries = queries_in + self_attn->forward(q, q, queries_in);
  }
  queries = norm1->forward(queries);
  auto q = queries + query_pe;
  auto k = keys + key_pe;
  queries = norm2->forward(queries + cross_attn_token_to_image->forward(q, k, keys));
  queries = norm3->forward(queries + mlp->forward(queries));
  q = queries + query_pe;
  k = keys + key_pe;
  keys = norm4->forward(keys + cross_attn_image_to_token->forward(k, q, queries));
  return {queries, keys};
}

// ----------------------------------------------------------------------- TwoWayTransformer

TwoWayTransformerImpl::TwoWayTransformerImpl(MaskDecoderOptions o) : options(std::move(o)) { reset(); }

void TwoWayTransformerImpl::reset() {
  const auto& o = options;
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.depth; ++i) layers->push_back(TwoWayAttentionBlock(o, i == 0));
  final_attn_token_to_image =
      register_module("final_attn_token_to_image",
                      TokenAttention(o.transformer_dim, o.num_heads, o.attention_downsample_rate));
  norm_final_attn = register_module("norm_final_attn",
                                    torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.transformer_dim})));
}

std::pair<at::Tensor, at::Tensor> TwoWayTransformerImpl::forward(const at::Tensor& image,
                                                                 const at::Tensor& image_pe,
                                                                 const at::Tensor& tokens) {
  auto keys = image.flatten(2).permute({0, 2, 1});
  auto key_pe = image_pe.flatten(2).permute({0, 2, 1});
  at::Tensor queries = tokens;
  for (size_t i = 0; i < layers->size(); ++i) {
    std::tie(queries, keys) = layers->at<TwoWayAttentionBlockImpl>(i).forward(queries, keys, tokens, key_pe);
  }
  auto q = queries + tokens;
  auto k = keys + key_pe;
  queries = norm_final_attn->forward(queries + final_attn_token_to_image->forward(q, k, keys));
  return {queries, keys};
}

// -------------------------------------------------------------------------------- HyperMlp

HyperMlpImpl::HyperMlpImpl(int64_t i, int64_t h, int64_t o, int64_t n)
    : input_dim(i), hidden_dim(h), output_dim(o), num_layers(n) {
  reset();
}

void HyperMlpImpl::reset() {
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t l = 0; l < num_layers; ++l) {
    layers->push_back(
        torch::nn::Linear(l == 0 ? input_dim : hidden_dim, l == num_layers - 1 ? output_dim : hidden_dim));
  }
}

at::Tensor HyperMlpImpl::forward(const at::Tensor& x) {
  at::Tensor h = x;
  for (size_t l = 0; l < layers->size(); ++l) {
    h = layers->at<torch::nn::LinearImpl>(l).forward(h);
    if (l + 1 < layers->size()) h = at::relu(h);
  }
  return h;
}

// ----------------------------------------------------------------------------- MaskDecoder

MaskDecoderImpl::MaskDecoderImpl(MaskDecoderOptions o) : options(std::move(o)) { reset(); }

void MaskDecoderImpl::reset() {
  const auto& o = options;
  const int64_t D = o.transformer_dim, tokens = o.num_multimask_outputs + 1;
  transformer = register_module("transformer", TwoWayTransformer(o));
  iou_token = register_module("iou_token", torch::nn::Embedding(1, D));
  mask_tokens = register_module("mask_tokens", torch::nn::Embedding(tokens, D));
  output_upscaling = register_module(
      "output_upscaling",
      torch::nn::Sequential(ConvNd(ConvOptions{2, D, D / 4, 2, 2, 0, 0, /*transposed=*/true}),
                            LayerNorm2d(D / 4), torch::nn::GELU(),
                            ConvNd(ConvOptions{2, D / 4, D / 8, 2, 2, 0, 0, /*transposed=*/true}),
                            torch::nn::GELU()));
  output_hypernetworks_mlps = register_module("output_hypernetworks_mlps", torch::nn::ModuleList());
  for (int64_t i = 0; i < tokens; ++i) output_hypernetworks_mlps->push_back(HyperMlp(D, D, D / 8, 3));
  iou_prediction_head = o.iou_head
                            ? register_module("iou_prediction_head",
                                              HyperMlp(D, o.iou_head_hidden_dim, tokens, o.iou_head_depth))
                            : nullptr;
  if (o.frozen) set_requires_grad(*this, false);
}

std::pair<at::Tensor, at::Tensor> MaskDecoderImpl::forward(const at::Tensor& image_embeddings,
                                                           const at::Tensor& image_pe,
                                                           const at::Tensor& sparse, const at::Tensor& dense,
                                                           bool multimask) {
  const int64_t B = sparse.size(0);
  auto output_tokens =
      torch::cat({iou_token->weight, mask_tokens->weight}, 0).unsqueeze(0).expand({B, -1, -1});
  auto tokens = torch::cat({output_tokens, sparse}, 1);
  // MedSAM pairs image i with box i; SAM's single-image case repeats the image per box.
  at::Tensor src =
      image_embeddings.size(0) == B ? image_embeddings : torch::repeat_interleave(image_embeddings, B, 0);
  src = src + dense;
  auto pos_src = image_pe.expand({B, -1, -1, -1});
  const int64_t c = src.size(1), h = src.size(2), w = src.size(3);
  auto [hs, keys] = transformer->forward(src, pos_src, tokens);
  using torch::indexing::Slice;
  auto iou_token_out = hs.index({Slice(), 0, Slice()});
  auto mask_token0 = hs.index({Slice(), 1, Slice()});
  auto upscaled = output_upscaling->forward(keys.transpose(1, 2).reshape({B, c, h, w}));
  const int64_t uc = upscaled.size(1), uh = upscaled.size(2), uw = upscaled.size(3);
  // Without multimask only mask token 0 is returned (MedSAM's multimask_output = False), so
  // only its hypernetwork runs; with it, tokens 1.. (SAM's candidates for one click).
  const int64_t first = multimask ? 1 : 0, count = multimask ? options.num_multimask_outputs : 1;
  std::vector<at::Tensor> hyper_rows;
  for (int64_t t = first; t < first + count; ++t)
    hyper_rows.push_back(output_hypernetworks_mlps->at<HyperMlpImpl>(static_cast<std::size_t>(t))
                             .forward(t == 0 ? mask_token0 : hs.index({Slice(), 1 + t, Slice()})));
  auto hyper = torch::stack(hyper_rows, 1);  // (B, count, uc)
  auto masks = hyper.matmul(upscaled.reshape({B, uc, uh * uw})).reshape({B, count, uh, uw});
  at::Tensor iou;
  if (iou_prediction_head)
    iou = iou_prediction_head->forward(iou_token_out).index({Slice(), Slice(first, first + count)});
  return {masks, iou};
}

std::shared_ptr<torch::nn::Module> MaskDecoderImpl::clone(const std::optional<torch::Device>& device) const {
  auto copy = Cloneable<MaskDecoderImpl>::clone(device);
  mirror_requires_grad(*this, *copy);
  return copy;
}

void MaskDecoderImpl::pretty_print(std::ostream& s) const {
  const auto& o = options;
  s << "segflow::models::MaskDecoder(transformer_dim=" << o.transformer_dim << ", depth=" << o.depth
    << ", num_heads=" << o.num_heads << ", mlp_dim=" << o.mlp_dim
    << ", mask_tokens=" << o.num_multimask_outputs + 1 << ", iou_head=" << (o.iou_head ? "true" : "false")
    << (o.frozen ? ", frozen" : "") << ")";
}

// ------------------------------------------------------------------------------------- Sam

SamImpl::SamImpl(SamOptions o) : options(std::move(o)) {
  options.resolve();
  auto st = options.validate();
  TORCH_CHECK(st.is_ok(), st.message());
  reset();
}

void SamImpl::reset() {
  image_encoder = register_module("image_encoder", ImageEncoderViT(options.image_encoder));
  prompt_encoder = register_module("prompt_encoder", PromptEncoder(options.prompt_encoder));
  mask_decoder = register_module("mask_decoder", MaskDecoder(options.mask_decoder));
}

SamOutput SamImpl::forward_full(const at::Tensor& image, const at::Tensor& boxes) {
  const int64_t S = options.image_encoder.img_size;
  TORCH_CHECK(image.dim() == 4 && image.size(2) == S && image.size(3) == S, "Sam: expected an image (B, ",
              options.image_encoder.in_chans, ", ", S, ", ", S, "), got shape ", image.sizes());
  TORCH_CHECK(boxes.size(0) == image.size(0), "Sam: expected one box per image, got ", boxes.size(0),
              " boxes for ", image.size(0), " images");
  auto embeddings = image_encoder->forward(image);
  auto [sparse, dense] = prompt_encoder->forward(boxes);
  auto [low_res, iou] = mask_decoder->forward(embeddings, prompt_encoder->get_dense_pe(), sparse, dense);
  auto masks = F::interpolate(low_res, F::InterpolateFuncOptions()
                                           .size(std::vector<int64_t>{image.size(2), image.size(3)})
                                           .mode(torch::kBilinear)
                                           .align_corners(false));
  return {masks, low_res, iou, embeddings};
}

SamOutput SamImpl::forward_prompts(const at::Tensor& image, const SamPrompts& prompts, bool multimask) {
  const int64_t S = options.image_encoder.img_size;
  TORCH_CHECK(image.dim() == 4 && image.size(2) == S && image.size(3) == S, "Sam: expected an image (B, ",
              options.image_encoder.in_chans, ", ", S, ", ", S, "), got shape ", image.sizes());
  auto embeddings = image_encoder->forward(image);
  auto [sparse, dense] = prompt_encoder->encode(prompts);
  TORCH_CHECK(sparse.size(0) == image.size(0), "Sam: expected one prompt set per image, got ", sparse.size(0),
              " for ", image.size(0), " images");
  auto [low_res, iou] =
      mask_decoder->forward(embeddings, prompt_encoder->get_dense_pe(), sparse, dense, multimask);
  auto masks = F::interpolate(low_res, F::InterpolateFuncOptions()
                                           .size(std::vector<int64_t>{image.size(2), image.size(3)})
                                           .mode(torch::kBilinear)
                                           .align_corners(false));
  return {masks, low_res, iou, embeddings};
}

at::Tensor SamImpl::forward(const at::Tensor& image, const at::Tensor& boxes) {
  return forward_full(image, boxes).masks;
}

std::shared_ptr<torch::nn::Module> SamImpl::clone(const std::optional<torch::Device>& device) const {
  auto copy = Cloneable<SamImpl>::clone(device);
  mirror_requires_grad(*this, *copy);
  return copy;
}

void SamImpl::pretty_print(std::ostream& s) const {
  const auto& e = options.image_encoder;
  s << "segflow::models::Sam(img_size=" << e.img_size << ", patch_size=" << e.patch_size
    << ", embed_dim=" << e.embed_dim << ", depth=" << e.depth << ", out_chans=" << e.out_chans << ")";
}

// ---------------------------------------------------------------------- the network's row

namespace {

void bind_sam(pipeline::OptionParser& p, SamModelOptions& m) {
  p.choice("preset", m.preset, SamOptions::preset_names(),
           "the base every other key overrides: tiny, small or vit_b (SAM ViT-B)");
  if (p.given("preset") && p.ok()) m.sam = SamOptions::preset(m.preset).value();
  int dims = 2;
  std::int64_t out = 1;
  p.integer("spatial_dims", dims, pipeline::Range::any(), "", "2 (sam is a 2D model)");
  if (dims != 2) p.fail("spatial_dims", "expected 2 (sam is a 2D model), got " + std::to_string(dims));
  p.integer("out_channels", out, pipeline::Range::any(), "channels", "1 (one mask per box, sigmoid logits)");
  if (out != 1)
    p.fail("out_channels", "expected 1 (one mask per box, sigmoid logits), got " + std::to_string(out));
  auto& e = m.sam.image_encoder;
  auto& d = m.sam.mask_decoder;
  p.integer("in_channels", e.in_chans, pipeline::Range::at_least(1), "channels", "image channels");
  p.integer("img_size", e.img_size, pipeline::Range::at_least(1), "pixels",
            "input height = width (a multiple of patch_size)");
  p.integer("patch_size", e.patch_size, pipeline::Range::at_least(1), "pixels", "patch side");
  p.integer("embed_dim", e.embed_dim, pipeline::Range::at_least(1), "channels",
            "token width (a multiple of num_heads)");
  p.integer("depth", e.depth, pipeline::Range::at_least(1), "", "transformer blocks of the image encoder");
  p.integer("num_heads", e.num_heads, pipeline::Range::at_least(1), "",
            "attention heads of the image encoder");
  p.number("mlp_ratio", e.mlp_ratio, pipeline::Range::positive(), "", "MLP hidden width / embed_dim");
  p.integer("out_chans", e.out_chans, pipeline::Range::at_least(8), "channels",
            "neck output channels (a multiple of 8)");
  p.boolean("use_rel_pos", e.use_rel_pos, "SAM's decomposed relative positions");
  p.integer("window_size", e.window_size, pipeline::Range::non_negative(), "patches",
            "windowed attention window; 0 = global attention everywhere");
  p.integer_list("global_attn_indexes", e.global_attn_indexes, pipeline::Range::non_negative(), true,
                 "blocks with global attention when windowed (each < depth)");
  p.integer("decoder_depth", d.depth, pipeline::Range::at_least(1), "",
            "two-way attention blocks of the mask decoder");
  p.integer("decoder_heads", d.num_heads, pipeline::Range::at_least(1), "",
            "attention heads of the mask decoder");
  p.integer("decoder_mlp_dim", d.mlp_dim, pipeline::Range::at_least(1), "channels", "mask decoder MLP width");
  p.integer("num_multimask_outputs", d.num_multimask_outputs, pipeline::Range::non_negative(), "",
            "extra mask tokens (the output uses token 0)");
  p.boolean("iou_head", d.iou_head, "IoU prediction head (needed to load SAM weights)");
  p.boolean("freeze_image_encoder", e.frozen, "no gradients for the image encoder");
  p.boolean("freeze_prompt_encoder", m.sam.prompt_encoder.frozen,
            "no gradients for the prompt encoder (MedSAM)");
  p.boolean("freeze_mask_decoder", d.frozen, "no gradients for the mask decoder");
  m.sam.resolve();
  if (p.ok()) p.check(m.sam.validate(), "sam");
}

Result<ModelHandle> build_sam(const SamModelOptions& so) {
  SamOptions o = so.sam;
  o.resolve();
  SEGFLOW_RETURN_IF_ERROR(o.validate());
  const auto& e = o.image_encoder;
  ModelInfo info{
      "sam", 2, e.in_chans, 1, true, false, e.patch_size, e.img_size, {e.patch_size, e.patch_size}};
  info.iou_output = o.mask_decoder.iou_head;
  auto m = Sam(o).ptr();
  return ModelHandle(info, m, [](torch::nn::Module& mod, const at::Tensor& x, const at::Tensor& box) {
    TORCH_CHECK(box.defined(), "sam: forward needs a box tensor (N, 4)");
    auto out = static_cast<SamImpl&>(mod).forward_full(x, box);
    if (!out.iou_predictions.defined()) return std::vector<at::Tensor>{out.masks};
    return std::vector<at::Tensor>{out.masks, out.iou_predictions};  // masks first: predict() takes front()
  });
}

std::int64_t sam_in_channels(const SamModelOptions& o) { return o.sam.image_encoder.in_chans; }

using nlohmann::json;

Result<ExportedModel> export_sam(const SamModelOptions& so, const torch::nn::Module& module) {
  const SamOptions& o = so.sam;
  ExportedModel m;
  m.target = "segment_anything.modeling.Sam";
  for (const auto& p : module.named_parameters())
    m.state_dict.emplace_back(p.key(), p.value().detach().to(at::kCPU).contiguous());
  for (const auto& b : module.named_buffers())
    m.state_dict.emplace_back(b.key(), b.value().detach().to(at::kCPU).contiguous());
  const auto& e = o.image_encoder;
  const auto& p = o.prompt_encoder;
  const auto& d = o.mask_decoder;
  // segment_anything's MaskDecoder always has an IoU head; a model trained without one (the
  // tiny preset, MedSAM's use: only mask token 0 is read) gets it as zeros, so the masks are
  // the same and the IoU predictions are 0.
  if (!d.iou_head) {
    const std::int64_t depth = std::max<std::int64_t>(d.iou_head_depth, 1);
    for (std::int64_t i = 0; i < depth; ++i) {
      const std::int64_t in = i == 0 ? d.transformer_dim : d.iou_head_hidden_dim;
      const std::int64_t out = i == depth - 1 ? d.num_multimask_outputs + 1 : d.iou_head_hidden_dim;
      const std::string stem = "mask_decoder.iou_prediction_head.layers." + std::to_string(i);
      m.state_dict.emplace_back(stem + ".weight", at::zeros({out, in}));
      m.state_dict.emplace_back(stem + ".bias", at::zeros({out}));
    }
  }
  m.spec = {{"target", m.target},
            {"image_encoder",
             {{"img_size", e.img_size},
              {"patch_size", e.patch_size},
              {"in_chans", e.in_chans},
              {"embed_dim", e.embed_dim},
              {"depth", e.depth},
              {"num_heads", e.num_heads},
              {"mlp_ratio", e.mlp_ratio},
              {"out_chans", e.out_chans},
              {"qkv_bias", e.qkv_bias},
              {"use_abs_pos", e.use_abs_pos},
              {"use_rel_pos", e.use_rel_pos},
              {"window_size", e.window_size},
              {"global_attn_indexes", e.global_attn_indexes},
              {"layer_norm_eps", 1e-6}}},
            {"prompt_encoder",
             {{"embed_dim", p.embed_dim},
              {"image_embedding_size", {p.image_embedding_size, p.image_embedding_size}},
              {"input_image_size", {p.input_image_size, p.input_image_size}},
              {"mask_in_chans", p.mask_in_chans}}},
            {"mask_decoder",
             {{"transformer_dim", d.transformer_dim},
              {"transformer_depth", d.depth},
              {"transformer_num_heads", d.num_heads},
              {"transformer_mlp_dim", d.mlp_dim},
              {"attention_downsample_rate", d.attention_downsample_rate},
              {"num_multimask_outputs", d.num_multimask_outputs},
              {"iou_head_depth", std::max<std::int64_t>(d.iou_head_depth, 1)},
              {"iou_head_hidden_dim", d.iou_head_hidden_dim},
              {"iou_head", d.iou_head ? "trained" : "zeros"}}}};
  return m;
}

}  // namespace

NetworkRow sam_network() {
  NetworkRow r =
      network_row<SamModelOptions>("sam", "box-prompted SAM", bind_sam, build_sam, sam_in_channels);
  r.pytorch = typed_hook<SamModelOptions>(export_sam);
  return r;
}

}  // namespace segflow::models
