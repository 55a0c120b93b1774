// The box-prompted SAM as two ONNX graphs (models/interop/onnx_export.hpp): the image encoder, and the
// prompt encoder + mask decoder. Walks segflow's SamImpl in evaluation mode and describes it
// with models/interop/onnx/onnx_graph.hpp structs; the parts that depend only on the fixed image size
// (relative-position tables, the dense positional encoding of the embedding grid) are
// computed here and stored as constants.
#include <ATen/ATen.h>
#include <torch/nn/functional/upsampling.h>

#include <cmath>
#include <unordered_map>

#include "messages/file_util.hpp"
#include "models/inference/box_inference.hpp"
#include "models/interop/detail/onnx_graph_builder.hpp"
#include "models/interop/onnx/onnx_graph.hpp"
#include "models/interop/onnx_export.hpp"
#include "models/nets/registry.hpp"
#include "models/nets/sam.hpp"
#include "models/training/class_names.hpp"
#include "models/training/job_config.hpp"
#include "pipeline/pipeline_spec.hpp"
#include "pipeline/stage_registry.hpp"

namespace segflow::models {
// A named namespace: onnx_export.cpp shares this file's unity batch and has helpers of its own.
namespace sam_onnx {

namespace og = onnx_graph;
using json = nlohmann::json;
using Attr = og::Attribute;
using Shape = std::vector<int64_t>;

/// Builds one graph; module tensors keep their names in the Sam (image_encoder.blocks.0...).
class SamGraph : public detail::OnnxGraphBuilder {
 public:
  SamGraph(const torch::nn::Module& root, bool fp16, int opset) : OnnxGraphBuilder(root, fp16) {
    graph.opset = opset;
  }

  std::string scalar(double v) { return constant(fresh("scalar"), at::full({}, v)); }

  /// An int64 constant (shapes, axes, indices); `scalar_shape` for a 0-d index.
  std::string ints(const Shape& values, bool scalar_shape = false) {
    at::Tensor t = at::tensor(values, at::kLong);
    if (scalar_shape) t = t.reshape({});
    const std::string name = fresh("ints");
    add_initializer(name, og::ElemType::int64, t);
    return name;
  }

  std::string reshape(const std::string& x, const Shape& shape) { return node("Reshape", {x, ints(shape)}); }
  std::string transpose(const std::string& x, const Shape& perm) {
    return node("Transpose", {x}, {Attr::list("perm", perm)});
  }
  int opset() const { return graph.opset; }
};

// ------------------------------------------------------------------------------- layers

std::string emit_linear(SamGraph& g, const torch::nn::LinearImpl& l, const std::string& x) {
  std::string y = g.node("MatMul", {x, g.transpose(g.weight(l.weight), {1, 0})});
  return l.bias.defined() ? g.node("Add", {y, g.weight(l.bias)}) : y;
}

std::string emit_gelu(SamGraph& g, const std::string& x) {  // torch's exact GELU, through Erf
  const auto erf = g.node("Erf", {g.node("Mul", {x, g.scalar(1.0 / std::sqrt(2.0))})});
  return g.node("Mul", {g.node("Mul", {x, g.scalar(0.5)}), g.node("Add", {erf, g.scalar(1.0)})});
}

/// (x - mean) / sqrt(var + eps) over `axis` (biased variance), before the affine part.
std::string emit_standardize(SamGraph& g, const std::string& x, int64_t axis, double eps) {
  const Attr axes = Attr::list("axes", {axis});
  const Attr keep = Attr::integer("keepdims", 1);
  const auto d = g.node("Sub", {x, g.node("ReduceMean", {x}, {axes, keep})});
  const auto var = g.node("ReduceMean", {g.node("Mul", {d, d})}, {axes, keep});
  return g.node("Div", {d, g.node("Sqrt", {g.node("Add", {var, g.scalar(eps)})})});
}

/// LayerNorm over the last axis: LayerNormalization from opset 17, decomposed below.
std::string emit_layer_norm(SamGraph& g, const torch::nn::LayerNormImpl& n, const std::string& x) {
  const double eps = n.options.eps();
  if (g.opset() >= 17)
    return g.node("LayerNormalization", {x, g.weight(n.weight), g.weight(n.bias)},
                  {Attr::integer("axis", -1), Attr::real("epsilon", static_cast<float>(eps))});
  const auto y = g.node("Mul", {emit_standardize(g, x, -1, eps), g.weight(n.weight)});
  return g.node("Add", {y, g.weight(n.bias)});
}

/// SAM's LayerNorm2d: over the channels of (B, C, H, W).
std::string emit_layer_norm_2d(SamGraph& g, const LayerNorm2dImpl& n, const std::string& x) {
  const auto w = g.reshape(g.weight(n.weight), {-1, 1, 1});
  const auto b = g.reshape(g.weight(n.bias), {-1, 1, 1});
  return g.node("Add", {g.node("Mul", {emit_standardize(g, x, 1, n.eps), w}), b});
}

std::string emit_conv(SamGraph& g, const ConvNdImpl& c, const std::string& x) {
  const ConvOptions& o = c.options;
  std::vector<int64_t> pads = c.resolved_padding();
  pads.insert(pads.end(), pads.begin(), pads.end());
  std::vector<std::string> in = {x, g.weight(c.weight)};
  if (c.bias.defined()) in.push_back(g.weight(c.bias));
  std::vector<Attr> attrs = {Attr::list("kernel_shape", o.kernel_size.expand(2)),
                             Attr::list("strides", o.stride.expand(2)), Attr::list("pads", pads)};
  if (o.transposed) attrs.push_back(Attr::list("output_padding", o.output_padding.expand(2)));
  return g.node(o.transposed ? "ConvTranspose" : "Conv", std::move(in), std::move(attrs));
}

/// softmax(q k^T / sqrt(d) [+ bias]) v on (B, heads, N, d).
std::string emit_sdpa(SamGraph& g, const std::string& q, const std::string& k, const std::string& v,
                      int64_t head_dim, const std::string& bias = {}) {
  const auto qs = g.node("Mul", {q, g.scalar(1.0 / std::sqrt(static_cast<double>(head_dim)))});
  std::string s = g.node("MatMul", {qs, g.transpose(k, {0, 1, 3, 2})});
  if (!bias.empty()) s = g.node("Add", {s, bias});
  return g.node("MatMul", {g.node("Softmax", {s}, {Attr::integer("axis", -1)}), v});
}

// ------------------------------------------------------------------------ image encoder

/// SAM's get_rel_pos for the fixed size: the (size, size, d) table, resized when trained
/// for another size; returned as (size, d, size) for a broadcast MatMul.
at::Tensor rel_pos_table(int64_t size, const at::Tensor& rel_pos) {
  namespace F = torch::nn::functional;
  const int64_t max_rel_dist = 2 * size - 1;
  at::Tensor table = rel_pos.detach().to(at::kFloat);
  if (table.size(0) != max_rel_dist) {
    auto t = table.reshape({1, table.size(0), -1}).permute({0, 2, 1});
    t = F::interpolate(t, F::InterpolateFuncOptions()
                              .size(std::vector<int64_t>{max_rel_dist})
                              .mode(torch::kLinear)
                              .align_corners(false));
    table = t.reshape({-1, max_rel_dist}).permute({1, 0});
  }
  const at::Tensor c = at::arange(size, at::kLong);
  return table.index({c.unsqueeze(1) - c.unsqueeze(0) + (size - 1)}).permute({0, 2, 1}).contiguous();
}

/// VitAttention on (Bw, H, W, C) windows (H = W = the window or the grid).
std::string emit_vit_attention(SamGraph& g, const VitAttentionImpl& a, const std::string& x, int64_t H,
                               int64_t W, const std::string& prefix) {
  const int64_t C = a.dim, heads = a.num_heads, d = C / heads, n = H * W;
  const auto qkv = g.transpose(g.reshape(emit_linear(g, *a.qkv, x), {0, n, 3, heads, d}), {2, 0, 3, 1, 4});
  auto part = [&](int64_t i) {
    return g.node("Gather", {qkv, g.ints({i}, true)}, {Attr::integer("axis", 0)});
  };
  const auto q = part(0), k = part(1), v = part(2);  // (Bw, heads, n, d)
  std::string bias;
  if (a.use_rel_pos) {
    // rel_h[b, h, w, k] = q[b, h, w] . Rh[h, k]; rel_w likewise over w (q transposed to (w, h)).
    const auto rq = g.reshape(q, {-1, H, W, d});
    const auto rh = g.constant(prefix + ".rel_pos_h.table", rel_pos_table(H, a.rel_pos_h));
    const auto rw = g.constant(prefix + ".rel_pos_w.table", rel_pos_table(W, a.rel_pos_w));
    const auto rel_h = g.node("MatMul", {rq, rh});  // (BH, H, W, H)
    const auto rel_w = g.transpose(g.node("MatMul", {g.transpose(rq, {0, 2, 1, 3}), rw}), {0, 2, 1, 3});
    const auto sum = g.node("Add", {g.reshape(rel_h, {0, H, W, H, 1}), g.reshape(rel_w, {0, H, W, 1, W})});
    bias = g.reshape(sum, {-1, heads, n, n});
  }
  const auto out = g.reshape(g.transpose(emit_sdpa(g, q, k, v, d, bias), {0, 2, 1, 3}), {0, H, W, C});
  return emit_linear(g, *a.proj, out);
}

/// Window partition (padding to a multiple of ws), attention, unpartition, crop.
std::string emit_windowed(SamGraph& g, const VitBlockImpl& b, const std::string& x, int64_t grid,
                          const std::string& prefix) {
  const int64_t ws = b.window_size, C = b.options.embed_dim;
  const int64_t pad = (ws - grid % ws) % ws, P = grid + pad, nw = P / ws;
  std::string h = x;
  if (pad > 0) h = g.node("Pad", {h, g.ints({0, 0, 0, 0, 0, pad, pad, 0})});
  h = g.reshape(g.transpose(g.reshape(h, {0, nw, ws, nw, ws, C}), {0, 1, 3, 2, 4, 5}), {-1, ws, ws, C});
  h = emit_vit_attention(g, *b.attn, h, ws, ws, prefix);
  h = g.reshape(g.transpose(g.reshape(h, {-1, nw, nw, ws, ws, C}), {0, 1, 3, 2, 4, 5}), {-1, P, P, C});
  if (pad > 0) h = g.node("Slice", {h, g.ints({0, 0}), g.ints({grid, grid}), g.ints({1, 2})});
  return h;
}

std::string emit_vit_block(SamGraph& g, const VitBlockImpl& b, const std::string& x, int64_t grid,
                           const std::string& prefix) {
  const auto n1 = emit_layer_norm(g, *b.norm1, x);
  const auto h = b.window_size > 0 ? emit_windowed(g, b, n1, grid, prefix + ".attn")
                                   : emit_vit_attention(g, *b.attn, n1, grid, grid, prefix + ".attn");
  const auto y = g.node("Add", {x, h});
  const auto& mlp = *b.mlp;
  const auto m =
      emit_linear(g, *mlp.lin2, emit_gelu(g, emit_linear(g, *mlp.lin1, emit_layer_norm(g, *b.norm2, y))));
  return g.node("Add", {y, m});
}

/// image (B, in_chans, S, S) -> image_embeddings (B, out_chans, S/patch, S/patch).
void emit_encoder(SamGraph& g, const ImageEncoderViTImpl& enc) {
  const auto& o = enc.options;
  const int64_t grid = o.img_size / o.patch_size;
  std::string h = g.transpose(emit_conv(g, *enc.patch_embed->proj, "image"), {0, 2, 3, 1});
  if (enc.pos_embed.defined()) h = g.node("Add", {h, g.weight(enc.pos_embed)});
  for (size_t i = 0; i < enc.blocks->size(); ++i)
    h = emit_vit_block(g, enc.blocks->at<VitBlockImpl>(i), h, grid,
                       "image_encoder.blocks." + std::to_string(i));
  h = g.transpose(h, {0, 3, 1, 2});
  h = emit_conv(g, enc.neck->at<ConvNdImpl>(0), h);
  h = emit_layer_norm_2d(g, enc.neck->at<LayerNorm2dImpl>(1), h);
  h = emit_conv(g, enc.neck->at<ConvNdImpl>(2), h);
  h = emit_layer_norm_2d(g, enc.neck->at<LayerNorm2dImpl>(3), h);
  g.graph.nodes.back().outputs = {"image_embeddings"};
}

// ------------------------------------------------------------------ prompts and decoder

std::string emit_token_attention(SamGraph& g, const TokenAttentionImpl& a, const std::string& q,
                                 const std::string& k, const std::string& v) {
  const int64_t internal = a.embedding_dim / a.downsample_rate, d = internal / a.num_heads;
  auto heads = [&](const torch::nn::LinearImpl& proj, const std::string& x) {
    return g.transpose(g.reshape(emit_linear(g, proj, x), {0, 0, a.num_heads, d}), {0, 2, 1, 3});
  };
  const auto out = emit_sdpa(g, heads(*a.q_proj, q), heads(*a.k_proj, k), heads(*a.v_proj, v), d);
  return emit_linear(g, *a.out_proj, g.reshape(g.transpose(out, {0, 2, 1, 3}), {0, 0, internal}));
}

std::string emit_mlp(SamGraph& g, const MlpBlockImpl& m, const std::string& x) {
  const auto h = emit_linear(g, *m.lin1, x);
  return emit_linear(g, *m.lin2, m.act == ActKind::gelu ? emit_gelu(g, h) : g.node("Relu", {h}));
}

/// One TwoWayAttentionBlock: {queries, keys}.
std::pair<std::string, std::string> emit_two_way_block(SamGraph& g, const TwoWayAttentionBlockImpl& b,
                                                       const std::string& queries_in, const std::string& keys,
                                                       const std::string& query_pe,
                                                       const std::string& key_pe) {
  std::string queries;
  if (b.skip_first_layer_pe) {
    queries = emit_token_attention(g, *b.self_attn, queries_in, queries_in, queries_in);
  } else {
    const auto q = g.node("Add", {queries_in, query_pe});
    queries = g.node("Add", {queries_in, emit_token_attention(g, *b.self_attn, q, q, queries_in)});
  }
  queries = emit_layer_norm(g, *b.norm1, queries);
  auto q = g.node("Add", {queries, query_pe});
  auto k = g.node("Add", {keys, key_pe});
  queries = emit_layer_norm(
      g, *b.norm2,
      g.node("Add", {queries, emit_token_attention(g, *b.cross_attn_token_to_image, q, k, keys)}));
  queries = emit_layer_norm(g, *b.norm3, g.node("Add", {queries, emit_mlp(g, *b.mlp, queries)}));
  q = g.node("Add", {queries, query_pe});
  k = g.node("Add", {keys, key_pe});
  const auto new_keys = emit_layer_norm(
      g, *b.norm4,
      g.node("Add", {keys, emit_token_attention(g, *b.cross_attn_image_to_token, k, q, queries)}));
  return {queries, new_keys};
}

std::string emit_hyper_mlp(SamGraph& g, const HyperMlpImpl& m, const std::string& x) {
  std::string h = x;
  for (size_t l = 0; l < m.layers->size(); ++l) {
    h = emit_linear(g, m.layers->at<torch::nn::LinearImpl>(l), h);
    if (l + 1 < m.layers->size()) h = g.node("Relu", {h});
  }
  return h;
}

/// boxes (B, 4) -> the sparse prompt embeddings (B, 2, D): the corners' random Fourier
/// features plus the corner embeddings (PromptEncoderImpl::forward).
std::string emit_box_prompt(SamGraph& g, PromptEncoderImpl& pe) {
  const double S = static_cast<double>(pe.options.input_image_size);
  const auto coords = g.node("Add", {g.reshape("boxes", {-1, 2, 2}), g.scalar(0.5)});
  const auto unit = g.node("Mul", {coords, g.constant(g.fresh("inv_size"), at::tensor({1.0 / S, 1.0 / S}))});
  const auto centred = g.node("Sub", {g.node("Mul", {unit, g.scalar(2.0)}), g.scalar(1.0)});
  const auto proj =
      g.node("Mul", {g.node("MatMul", {centred, g.weight(pe.pe_layer->positional_encoding_gaussian_matrix)}),
                     g.scalar(2.0 * M_PI)});
  const auto fourier =
      g.node("Concat", {g.node("Sin", {proj}), g.node("Cos", {proj})}, {Attr::integer("axis", -1)});
  const at::Tensor corners = at::cat({pe.point_embeddings->at<torch::nn::EmbeddingImpl>(2).weight,
                                      pe.point_embeddings->at<torch::nn::EmbeddingImpl>(3).weight});
  return g.node("Add", {fourier, g.constant("prompt_encoder.box_corner_embeddings", corners)});
}

/// image_embeddings (B, D, h, w), boxes (B, 4) -> low_res_masks (B, 1, 4h, 4w)
/// [, iou_predictions (B, 1)] (MaskDecoderImpl::forward with mask token 0).
void emit_decoder(SamGraph& g, SamImpl& sam) {
  const MaskDecoderImpl& md = *sam.mask_decoder;
  const int64_t D = md.options.transformer_dim, e = sam.prompt_encoder->options.image_embedding_size;
  const auto sparse = emit_box_prompt(g, *sam.prompt_encoder);
  // Output tokens (1, T, D) broadcast to the batch of boxes.
  const at::Tensor out_tokens = at::cat({md.iou_token->weight, md.mask_tokens->weight}).unsqueeze(0);
  const auto batch = g.node("Slice", {g.node("Shape", {"boxes"}), g.ints({0}), g.ints({1})});
  const auto expand_to = g.node("Concat", {batch, g.ints({1, 1})}, {Attr::integer("axis", 0)});
  const auto expanded = g.node("Expand", {g.constant("mask_decoder.output_tokens", out_tokens), expand_to});
  const auto tokens = g.node("Concat", {expanded, sparse}, {Attr::integer("axis", 1)});
  // The dense prompt is the "no mask" embedding at every cell.
  const auto no_mask = g.reshape(g.weight(sam.prompt_encoder->no_mask_embed->weight), {1, D, 1, 1});
  const auto src = g.node("Add", {"image_embeddings", no_mask});
  std::string keys = g.transpose(g.reshape(src, {0, D, e * e}), {0, 2, 1});
  const at::Tensor dense_pe = sam.prompt_encoder->get_dense_pe().detach();  // (1, D, e, e)
  const auto key_pe = g.constant("prompt_encoder.dense_pe", dense_pe.flatten(2).permute({0, 2, 1}));
  std::string queries = tokens;
  const auto& tf = *md.transformer;
  for (size_t i = 0; i < tf.layers->size(); ++i)
    std::tie(queries, keys) =
        emit_two_way_block(g, tf.layers->at<TwoWayAttentionBlockImpl>(i), queries, keys, tokens, key_pe);
  const auto q = g.node("Add", {queries, tokens});
  const auto k = g.node("Add", {keys, key_pe});
  const auto hs = emit_layer_norm(
      g, *tf.norm_final_attn,
      g.node("Add", {queries, emit_token_attention(g, *tf.final_attn_token_to_image, q, k, keys)}));
  auto token = [&](int64_t i) {
    return g.node("Gather", {hs, g.ints({i}, true)}, {Attr::integer("axis", 1)});
  };
  // Upscaling: ConvTranspose, LayerNorm2d, GELU, ConvTranspose, GELU.
  const auto& up = *md.output_upscaling;
  std::string u = g.reshape(g.transpose(keys, {0, 2, 1}), {0, D, e, e});
  u = emit_gelu(g, emit_layer_norm_2d(g, up.at<LayerNorm2dImpl>(1), emit_conv(g, up.at<ConvNdImpl>(0), u)));
  u = emit_gelu(g, emit_conv(g, up.at<ConvNdImpl>(3), u));
  const int64_t uc = D / 8, ue = 4 * e;
  const auto hyper =
      g.reshape(emit_hyper_mlp(g, md.output_hypernetworks_mlps->at<HyperMlpImpl>(0), token(1)), {0, 1, uc});
  const auto masks = g.node("MatMul", {hyper, g.reshape(u, {0, uc, ue * ue})});
  g.node("Reshape", {masks, g.ints({0, 1, ue, ue})}, {}, "low_res_masks");
  if (md.iou_prediction_head)
    g.node("Slice",
           {emit_hyper_mlp(g, *md.iou_prediction_head, token(0)), g.ints({0}), g.ints({1}), g.ints({1})}, {},
           "iou_predictions");
}

og::ValueInfo value(const std::string& name, std::vector<og::Dim> shape) {
  og::ValueInfo v;
  v.name = name;
  v.shape = std::move(shape);
  return v;
}

/// The two graphs, checked and serialised: {encoder bytes, decoder bytes}, or the error.
Result<std::pair<std::string, std::string>> sam_graphs(const SamImpl& sam_in, const OnnxExportOptions& eo) {
  auto& sam = const_cast<SamImpl&>(sam_in);  // get_dense_pe and the module accessors are not const
  const auto& eo_ = sam.options.image_encoder;
  const int64_t S = eo_.img_size, e = S / eo_.patch_size, D = eo_.out_chans;
  const og::Dim batch{-1, "batch"};
  SamGraph enc(sam, eo.fp16_weights, eo.opset);
  enc.graph.name = "sam_image_encoder";
  enc.graph.doc = "segflow sam image encoder: image (B, 3, S, S) normalised -> image_embeddings";
  emit_encoder(enc, *sam.image_encoder);
  enc.graph.inputs.push_back(value("image", {batch, {eo_.in_chans, ""}, {S, ""}, {S, ""}}));
  enc.graph.outputs.push_back(value("image_embeddings", {batch, {D, ""}, {e, ""}, {e, ""}}));
  SamGraph dec(sam, eo.fp16_weights, eo.opset);
  dec.graph.name = "sam_mask_decoder";
  dec.graph.doc = "segflow sam prompt encoder + mask decoder: image_embeddings, boxes -> low_res_masks";
  emit_decoder(dec, sam);
  dec.graph.inputs.push_back(value("image_embeddings", {batch, {D, ""}, {e, ""}, {e, ""}}));
  dec.graph.inputs.push_back(value("boxes", {batch, {4, ""}}));
  dec.graph.outputs.push_back(value("low_res_masks", {batch, {1, ""}, {4 * e, ""}, {4 * e, ""}}));
  if (sam.mask_decoder->iou_prediction_head)
    dec.graph.outputs.push_back(value("iou_predictions", {batch, {1, ""}}));
  std::pair<std::string, std::string> bytes;
  for (auto* g : {&enc, &dec}) {
    g->graph.metadata.emplace_back("segflow.model", "sam");
    g->graph.metadata.emplace_back("segflow.part", g == &enc ? "image_encoder" : "mask_decoder");
    const std::string err = og::serialize_model(g->graph, g == &enc ? bytes.first : bytes.second);
    if (!err.empty()) return invalid_argument(g->graph.name + ": " + err);
  }
  return bytes;
}

}  // namespace sam_onnx
}  // namespace segflow::models

namespace segflow::models {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::vector<fs::path> sam_onnx_files(const fs::path& out) {
  fs::path enc = out, dec = out;
  enc.replace_extension(".encoder.onnx");
  dec.replace_extension(".decoder.onnx");
  return {enc, dec};
}

Status write_sam_onnx(const SamImpl& sam, const fs::path& out, const OnnxExportOptions& eo) {
  torch::NoGradGuard no_grad;
  SEGFLOW_ASSIGN_OR_RETURN(auto bytes, sam_onnx::sam_graphs(sam, eo));
  const std::vector<fs::path> files = sam_onnx_files(out);
  SEGFLOW_RETURN_IF_ERROR(write_file_atomically(files[0], bytes.first));
  if (Status st = write_file_atomically(files[1], bytes.second); !st.is_ok()) {
    std::error_code ec;
    fs::remove(files[0], ec);
    return st;
  }
  return Status::ok();
}

namespace {

/// The deterministic stages box inference runs on the volume (those before medsam_box) and
/// the resize_longest_side size after it (0: none).
Result<std::pair<json, int64_t>> sam_box_stages(const JobConfig& cfg) {
  SEGFLOW_ASSIGN_OR_RETURN(pipeline::Pipeline pipe,
                           pipeline::build_pipeline(cfg.stages, pipeline::builtin_registry(), cfg.file));
  const json all = pipe.to_json();
  std::size_t medsam = pipe.size();
  for (std::size_t i = 0; i < pipe.size(); ++i)
    if (all[i].value("name", "") == "medsam_box") {
      medsam = i;
      break;
    }
  json stages = json::array();
  for (std::size_t i = 0; i < medsam; ++i)
    if (pipe.stages()[i]->deterministic()) stages.push_back(all[i]);
  int64_t longest = 0;
  for (std::size_t i = medsam + 1; i < pipe.size() && longest == 0; ++i)
    if (all[i].value("name", "") == "resize_longest_side")
      longest = all[i]["options"].value("size", int64_t{0});
  return std::make_pair(stages, longest);
}

}  // namespace

namespace {

json sam_tensor(const std::string& name, json shape) {
  return {{"name", name}, {"shape", std::move(shape)}, {"dtype", "float32"}};
}

/// The manifest's "model": the two files with their inputs and outputs.
json sam_model_json(const SamOptions& o, const fs::path& onnx_file, const OnnxExportOptions& eo, bool iou) {
  const int64_t S = o.image_encoder.img_size, e = S / o.image_encoder.patch_size,
                D = o.image_encoder.out_chans;
  const std::vector<fs::path> files = sam_onnx_files(onnx_file);
  const json embeddings = sam_tensor("image_embeddings", {"batch", D, e, e});
  json outputs = {sam_tensor("low_res_masks", {"batch", 1, 4 * e, 4 * e})};
  if (iou) outputs.push_back(sam_tensor("iou_predictions", {"batch", 1}));
  return {{"family", "sam"},
          {"opset", eo.opset},
          {"weights", eo.fp16_weights ? "float16" : "float32"},
          {"spatial_dims", 2},
          {"image_size", S},
          {"fixed_size", "the encoder takes exactly image_size x image_size (no dynamic spatial axes)"},
          {"encoder",
           {{"file", files[0].filename().string()},
            {"inputs", {sam_tensor("image", {"batch", o.image_encoder.in_chans, S, S})}},
            {"outputs", {embeddings}}}},
          {"decoder",
           {{"file", files[1].filename().string()},
            {"inputs", {embeddings, sam_tensor("boxes", {"batch", 4})}},
            {"outputs", outputs},
            {"batch", "one box per embedding: repeat an image's embedding for each of its boxes"}}}};
}

}  // namespace

Result<json> sam_onnx_manifest(const JobConfig& cfg, const ModelInfo& info, const fs::path& onnx_file,
                               const OnnxExportOptions& eo) {
  const SamOptions& o = cfg.model.get<SamModelOptions>().sam;
  const std::string S = std::to_string(o.image_encoder.img_size);
  SEGFLOW_ASSIGN_OR_RETURN(auto box_stages, sam_box_stages(cfg));
  const auto& [stages, longest] = box_stages;
  const std::string slice_rule =
      longest > 0
          ? "resize_longest_side: the slice's longest side resized to " + std::to_string(longest) +
                " (bilinear, align_corners false), zero-padded at the bottom/right to " + S + " x " + S
          : "bilinear resize (align_corners false) of the slice to " + S + " x " + S +
                " (none when it already has that size)";
  const std::string box_rule =
      longest > 0
          ? "x0, y0, x1, y1 (voxel indices, inclusive) times s = " + std::to_string(longest) + " / max(H, W)"
          : "[x0 * S / W, y0 * S / H, (x1 + 1) * S / W - 1, (y1 + 1) * S / H - 1] for the "
            "inclusive voxel box x0..x1, y0..y1 of an H x W slice (S = image_size)";
  const std::string upsample_rule =
      longest > 0 ? "low_res_masks bilinear (align_corners false) to S x S, cut to the unpadded "
                    "part (the resized slice's size), then bilinear to H x W"
                  : "low_res_masks bilinear (align_corners false) to the slice's H x W";
  return json{{"format", "segflow-onnx-manifest"},
              {"version", 1},
              {"job", cfg.name},
              {"model", sam_model_json(o, onnx_file, eo, info.iou_output)},
              {"classes", eo.class_names.empty() ? job_class_names(cfg) : eo.class_names},
              {"preprocessing",
               {{"stages", stages},
                {"note",
                 "the deterministic stages before medsam_box, run on the whole volume (C, Z, Y, X); the "
                 "model then sees one axial slice at a time"},
                {"slice",
                 {{"channels", "a 1-channel slice repeated to 3 channels"},
                  {"resize", slice_rule},
                  {"resize_longest_side", longest}}}}},
              {"boxes",
               {{"order", "x0, y0, x1, y1"},
                {"frame", "pixels of the model input (the resized slice), float32"},
                {"from_voxel_box", box_rule}}},
              {"postprocessing",
               {{"upsample", upsample_rule},
                {"activation", "sigmoid"},
                {"mask_threshold", kMaskThreshold},
                {"label_merge",
                 "a pixel takes a box's label when its probability is above mask_threshold and above the "
                 "probability it holds (segflow infer --boxes)"}}}};
}

}  // namespace segflow::models
