// The LibTorch side of the ONNX export: walks segflow's UNet / PlainConvUNet modules and
// describes them as a models/interop/onnx/onnx_graph.hpp Graph (plain structs), which the torch-free
// writer turns into a checked .onnx.
#include "models/interop/onnx_export.hpp"

#include <ATen/ATen.h>

#include <cmath>
#include <map>
#include <unordered_map>

#include "messages/file_util.hpp"
#include "models/inference/inference.hpp"
#include "models/interop/detail/onnx_graph_builder.hpp"
#include "models/interop/onnx/onnx_graph.hpp"
#include "models/nets/plain_unet.hpp"
#include "models/nets/registry.hpp"
#include "models/nets/res_enc_unet.hpp"
#include "models/nets/sam.hpp"
#include "models/nets/unet.hpp"
#include "models/training/class_names.hpp"
#include "models/training/job_config.hpp"
#include "pipeline/pipeline_spec.hpp"
#include "pipeline/stage_registry.hpp"

namespace segflow::models {
namespace {

namespace og = onnx_graph;
using json = nlohmann::json;
using Attr = og::Attribute;

/// Builds the graph node by node; weights are named by their parameter / buffer names.
using GraphBuilder = detail::OnnxGraphBuilder;

std::string emit_conv(GraphBuilder& g, const ConvNdImpl& c, const std::string& x) {
  const ConvOptions& o = c.options;
  const int nd = o.spatial_dims;
  const std::vector<int64_t> pad = c.resolved_padding();
  std::vector<int64_t> pads = pad;  // begin..., end...
  pads.insert(pads.end(), pad.begin(), pad.end());
  std::vector<std::string> in = {x, g.weight(c.weight)};
  if (c.bias.defined()) in.push_back(g.weight(c.bias));
  std::vector<Attr> attrs = {Attr::list("kernel_shape", o.kernel_size.expand(nd)),
                             Attr::list("strides", o.stride.expand(nd)), Attr::list("pads", pads),
                             Attr::list("dilations", std::vector<int64_t>(static_cast<size_t>(nd), 1))};
  if (o.transposed) attrs.push_back(Attr::list("output_padding", o.output_padding.expand(nd)));
  return g.node(o.transposed ? "ConvTranspose" : "Conv", std::move(in), std::move(attrs));
}

std::string emit_norm(GraphBuilder& g, const NormImpl& n, const std::string& x) {
  const NormOptions& o = n.options;
  const auto scale = o.affine ? g.weight(n.weight) : g.constant(g.fresh("ones"), at::ones({o.channels}));
  const auto shift = o.affine ? g.weight(n.bias) : g.constant(g.fresh("zeros"), at::zeros({o.channels}));
  const Attr eps = Attr::real("epsilon", static_cast<float>(o.eps));
  if (o.kind == NormKind::instance) return g.node("InstanceNormalization", {x, scale, shift}, {eps});
  return g.node("BatchNormalization", {x, scale, shift, g.weight(n.running_mean), g.weight(n.running_var)},
                {eps});
}

std::string emit_act(GraphBuilder& g, const ActivationImpl& a, const std::string& x) {
  switch (a.options.kind) {
    case ActKind::none:
      return x;
    case ActKind::relu:
      return g.node("Relu", {x});
    case ActKind::prelu:
      return g.node("PRelu", {x, g.weight(a.weight)});
    case ActKind::leakyrelu:
      return g.node("LeakyRelu", {x}, {Attr::real("alpha", static_cast<float>(a.options.negative_slope))});
    case ActKind::gelu: {  // x * 0.5 * (1 + erf(x / sqrt(2))), torch's exact GELU
      const auto inv_sqrt2 = g.constant(g.fresh("gelu_inv_sqrt2"), at::full({}, 1.0 / std::sqrt(2.0)));
      const auto half = g.constant(g.fresh("gelu_half"), at::full({}, 0.5));
      const auto one = g.constant(g.fresh("gelu_one"), at::full({}, 1.0));
      const auto erf = g.node("Erf", {g.node("Mul", {x, inv_sqrt2})});
      return g.node("Mul", {g.node("Mul", {x, half}), g.node("Add", {erf, one})});
    }
  }
  return x;
}

/// Conv, norm, activation; dropout is the identity in evaluation mode.
std::string emit_block(GraphBuilder& g, const ConvBlockImpl& b, const std::string& x) {
  std::string y = emit_conv(g, *b.conv, x);
  if (b.options.conv_only) return y;
  if (b.norm) y = emit_norm(g, *b.norm, y);
  if (b.act) y = emit_act(g, *b.act, y);
  return y;
}

std::string emit_residual_unit(GraphBuilder& g, const ResidualUnitImpl& r, const std::string& x) {
  std::string y = x;
  for (size_t i = 0; i < r.conv->size(); ++i) y = emit_block(g, r.conv->at<ConvBlockImpl>(i), y);
  if (!r.options.residual) return y;
  const std::string skip = r.residual ? emit_conv(g, *r.residual, x) : x;
  return g.node("Add", {y, skip});
}

std::string emit_unet(GraphBuilder& g, const UNetImpl& net, const std::string& x) {
  std::vector<std::string> skips;
  std::string h = x;
  for (size_t i = 0; i < net.down->size(); ++i) {
    h = emit_residual_unit(g, net.down->at<ResidualUnitImpl>(i), h);
    skips.push_back(h);
  }
  h = emit_residual_unit(g, *net.bottom, h);
  for (size_t i = net.up->size(); i-- > 0;) {
    const auto& up = net.up->at<UpLayerImpl>(i);
    h = emit_block(g, *up.conv, g.node("Concat", {skips[i], h}, {Attr::integer("axis", 1)}));
    if (up.ru) h = emit_residual_unit(g, *up.ru, h);
  }
  return h;
}

std::string emit_stack(GraphBuilder& g, const torch::nn::ModuleListImpl& blocks, std::string h) {
  for (size_t i = 0; i < blocks.size(); ++i) h = emit_block(g, blocks.at<ConvBlockImpl>(i), h);
  return h;
}

/// The full-resolution output only: the deep-supervision heads are training aids.
std::string emit_plain_unet(GraphBuilder& g, const PlainConvUNetImpl& net, const std::string& x) {
  std::vector<std::string> skips;
  std::string h = x;
  for (size_t s = 0; s < net.encoder_stages->size(); ++s) {
    h = emit_stack(g, net.encoder_stages->at<torch::nn::ModuleListImpl>(s), h);
    skips.push_back(h);
  }
  const size_t nd = net.decoder_stages->size();
  for (size_t d = 0; d < nd; ++d) {
    h = emit_conv(g, net.transpconvs->at<ConvNdImpl>(d), h);
    h = g.node("Concat", {h, skips[nd - 1 - d]}, {Attr::integer("axis", 1)});
    h = emit_stack(g, net.decoder_stages->at<torch::nn::ModuleListImpl>(d), h);
  }
  return emit_conv(g, net.seg_layers->at<ConvNdImpl>(nd - 1), h);
}

/// nnU-Net's BasicBlockD: LeakyRelu(conv2(conv1(x)) + skip(x)), the skip average-pooled by
/// the stride and projected by a 1x1 conv block where the block has them.
std::string emit_res_block(GraphBuilder& g, const ResBlockImpl& b, const std::string& x) {
  std::string skip = x;
  if (b.pooled) {
    const auto k = b.conv1_options.conv.stride.expand(b.conv1_options.conv.spatial_dims);
    skip = g.node("AveragePool", {skip}, {Attr::list("kernel_shape", k), Attr::list("strides", k)});
  }
  if (b.projected) skip = emit_block(g, b.skip->at<ConvBlockImpl>(b.skip->size() - 1), skip);
  const std::string y = emit_block(g, *b.conv2, emit_block(g, *b.conv1, x));
  return g.node("LeakyRelu", {g.node("Add", {y, skip})},
                {Attr::real("alpha", static_cast<float>(b.negative_slope))});
}

/// The full-resolution output only, as for plain_unet.
std::string emit_res_enc_unet(GraphBuilder& g, const ResEncUNetImpl& net, const std::string& x) {
  std::vector<std::string> skips;
  std::string h = emit_stack(g, *net.encoder->stem->convs, x);
  for (size_t s = 0; s < net.encoder->stages->size(); ++s) {
    const auto& blocks = *net.encoder->stages->at<ResStageImpl>(s).blocks;
    for (size_t i = 0; i < blocks.size(); ++i) h = emit_res_block(g, blocks.at<ResBlockImpl>(i), h);
    skips.push_back(h);
  }
  const auto& dec = *net.decoder;
  const size_t nd = dec.stages->size();
  for (size_t d = 0; d < nd; ++d) {
    h = emit_conv(g, dec.transpconvs->at<ConvNdImpl>(d), h);
    h = g.node("Concat", {h, skips[skips.size() - 2 - d]}, {Attr::integer("axis", 1)});
    h = emit_stack(g, *dec.stages->at<ConvStackImpl>(d).convs, h);
  }
  return emit_conv(g, dec.seg_layers->at<ConvNdImpl>(nd - 1), h);
}

/// What the ONNX target writes of each network it can write, by the network's name: one
/// graph (image -> logits) from `emit`, or SAM's two graphs.
/// The input and output of a one-graph network.
struct OnnxGraphShape {
  int spatial_dims = 3;
  int64_t in_channels = 1, out_channels = 2;
};

struct OnnxNetwork {
  const char* network;
  /// Emits the network's graph from input "image" (its last node the logits). Null: SAM's two
  /// graphs (write_sam_onnx).
  OnnxGraphShape (*emit)(GraphBuilder& g, const torch::nn::Module& module);
};

OnnxGraphShape emit_unet_module(GraphBuilder& g, const torch::nn::Module& m) {
  const auto& net = dynamic_cast<const UNetImpl&>(m);
  emit_unet(g, net, "image");
  return {net.options.spatial_dims, net.options.in_channels, net.options.out_channels};
}

OnnxGraphShape emit_plain_unet_module(GraphBuilder& g, const torch::nn::Module& m) {
  const auto& net = dynamic_cast<const PlainConvUNetImpl&>(m);
  emit_plain_unet(g, net, "image");
  return {net.options.spatial_dims, net.options.in_channels, net.options.num_classes};
}

OnnxGraphShape emit_res_enc_unet_module(GraphBuilder& g, const torch::nn::Module& m) {
  const auto& net = dynamic_cast<const ResEncUNetImpl&>(m);
  emit_res_enc_unet(g, net, "image");
  return {net.options.spatial_dims, net.options.in_channels, net.options.num_classes};
}

// clang-format off
constexpr OnnxNetwork kOnnxNetworks[] = {
    {"unet",         emit_unet_module},
    {"plain_unet",   emit_plain_unet_module},
    {"res_enc_unet", emit_res_enc_unet_module},
    {"sam",          nullptr},
};
// clang-format on

/// The ONNX target's entry for the network of `options`; unsupported naming the network and
/// the target (and the networks it writes) for another.
Result<const OnnxNetwork*> onnx_network(const ModelOptions& options) {
  std::string known;
  for (const auto& n : kOnnxNetworks) {
    if (options.name() == n.network) return &n;
    known += (known.empty() ? "" : ", ") + std::string(n.network);
  }
  return unsupported("export --to onnx: network '" + options.name() +
                     "' has no ONNX writer (networks it writes: " + known + ")");
}

og::ValueInfo tensor_info(const std::string& name, int64_t channels, const std::string& channel_axis,
                          int nd) {
  og::ValueInfo v;
  v.name = name;
  v.shape.push_back({-1, "batch"});
  v.shape.push_back({channels, channel_axis});
  const char* axes[] = {"z", "y", "x"};
  for (int d = 3 - nd; d < 3; ++d) v.shape.push_back({-1, axes[d]});
  return v;
}

}  // namespace

Status write_onnx_model(const ModelOptions& options, const torch::nn::Module& module,
                        const std::filesystem::path& out, const OnnxExportOptions& eo) {
  SEGFLOW_ASSIGN_OR_RETURN(const OnnxNetwork* net, onnx_network(options));
  if (!net->emit) return write_sam_onnx(dynamic_cast<const SamImpl&>(module), out, eo);
  GraphBuilder g(module, eo.fp16_weights);
  g.graph.opset = eo.opset;
  g.graph.name = options.name();
  g.graph.doc = "segflow " + options.name() + " in evaluation mode: image (N, C, [Z,] Y, X) -> logits";
  const OnnxGraphShape shape = net->emit(g, module);
  const int nd = shape.spatial_dims;
  const int64_t in = shape.in_channels, out_channels = shape.out_channels;
  // The last node writes the graph output by name.
  g.graph.nodes.back().outputs = {"logits"};
  g.graph.inputs.push_back(tensor_info("image", in, "", nd));
  g.graph.outputs.push_back(tensor_info("logits", out_channels, "", nd));
  g.graph.metadata.emplace_back("segflow.model", options.name());
  std::string bytes;
  const std::string err = og::serialize_model(g.graph, bytes);
  if (!err.empty()) return invalid_argument(out.string() + ": " + err);
  return write_file_atomically(out, bytes);
}

std::vector<std::filesystem::path> onnx_output_files(const ModelOptions& options,
                                                     const std::filesystem::path& out) {
  auto net = onnx_network(options);
  if (net.is_ok() && !(*net)->emit) return sam_onnx_files(out);
  return {out};
}

namespace {

/// What the deterministic stages do to the image, for a runtime that does not read segflow's
/// stage list: the orientation, the target spacing and the intensity stages in order.
json preprocessing_summary(const json& stages) {
  json summary = {{"orientation", nullptr}, {"spacing", nullptr}, {"intensity", json::array()}};
  for (const json& st : stages) {
    const std::string name = st.value("name", "");
    const json& o = st.contains("options") ? st["options"] : json::object();
    if (name == "reorient") {
      summary["orientation"] = o.value("axcodes", "");
    } else if (name == "resample") {
      summary["spacing"] = o.value("spacing", json());
      summary["spacing_grid"] = o.value("grid", "");
    } else if (name == "scale_intensity_range" || name == "normalize_intensity" || name == "zscore" ||
               name == "normalize_ct" || name == "clip_percentiles" || name == "medsam_preprocess") {
      summary["intensity"].push_back(st);
    } else if (name == "crop_foreground") {
      summary["crops"] = true;
    }
  }
  return summary;
}

}  // namespace

Result<json> onnx_manifest(const JobConfig& cfg, const ModelInfo& info,
                           const std::filesystem::path& onnx_file, const OnnxExportOptions& eo) {
  SEGFLOW_ASSIGN_OR_RETURN(const OnnxNetwork* net, onnx_network(cfg.model));
  if (!net->emit) return sam_onnx_manifest(cfg, info, onnx_file, eo);
  pipeline::StageRegistry registry = pipeline::builtin_registry();
  SEGFLOW_ASSIGN_OR_RETURN(pipeline::Pipeline pipe, pipeline::build_pipeline(cfg.stages, registry, cfg.file));
  const json all = pipe.to_json();
  json stages = json::array();
  for (std::size_t i = 0; i < pipe.cache_boundary() && i < all.size(); ++i) stages.push_back(all[i]);
  const std::string layout = info.spatial_dims == 3 ? "NCZYX" : "NCYX";
  const int64_t classes = info.out_channels;
  std::vector<std::string> names = eo.class_names.empty() ? job_class_names(cfg) : eo.class_names;
  const int64_t labels = classes == 1 ? 2 : classes;  // a sigmoid model predicts background / foreground
  for (auto v = static_cast<int64_t>(names.size()); v < labels; ++v)
    names.push_back("label_" + std::to_string(v));
  names.resize(static_cast<std::size_t>(labels));
  // TtaMode::mirror: the axes the training flipped, as `segflow infer --tta mirror` uses.
  const std::vector<int> mirror = tta_mirror_axes(TtaMode::mirror, all, info.spatial_dims);
  json roi = cfg.validation.roi_size.empty() ? json(nullptr) : json(cfg.validation.roi_size);
  return json{
      {"format", "segflow-onnx-manifest"},
      {"version", 1},
      {"job", cfg.name},
      {"model",
       {{"file", onnx_file.filename().string()},
        {"family", info.name},
        {"opset", eo.opset},
        {"weights", eo.fp16_weights ? "float16" : "float32"},
        {"spatial_dims", info.spatial_dims},
        {"input",
         {{"name", "image"}, {"layout", layout}, {"channels", info.in_channels}, {"dtype", "float32"}}},
        {"output", {{"name", "logits"}, {"layout", layout}, {"channels", classes}, {"dtype", "float32"}}},
        {"size_divisors", info.size_divisors},
        {"sizes_order", "x, y, z (tensors are N, C, Z, Y, X)"}}},
      {"classes", names},
      {"preprocessing", {{"stages", stages}, {"summary", preprocessing_summary(stages)}}},
      {"inference",
       {{"roi_size", roi},
        {"overlap", cfg.validation.overlap},
        {"blend", cfg.validation.mode},
        {"sigma_scale", 0.125},
        {"padding_value", 0.0},
        {"sw_batch_size", cfg.validation.sw_batch_size},
        {"activation", classes == 1 ? "sigmoid" : "softmax"},
        {"activation_after_blending", cfg.validation.mode == "nnunet"},
        {"tta",
         "none by default; segflow infer --tta mirror averages over every combination of flips of "
         "tta_mirror_axes (0 = x), window by window"},
        {"tta_mirror_axes", mirror},
        {"label_map",
         "argmax of the blended probabilities on the preprocessed grid, mapped back to the input's grid "
         "by nearest neighbour through patient coordinates"}}}};
}

}  // namespace segflow::models
