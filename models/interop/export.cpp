#include "models/interop/export.hpp"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <algorithm>
#include <regex>
#include <string_view>

#include "messages/file_util.hpp"
#include "models/nets/layers.hpp"
#include "models/nets/registry.hpp"
#include "models/nets/sam.hpp"
#include "models/nets/unet.hpp"

namespace segflow::models {

namespace {

using nlohmann::json;

/// A ConvBlock's own names -> MONAI's Convolution (conv, adn.N, adn.A).
std::string monai_adn(const std::string& rest) {
  if (rest.rfind("norm.", 0) == 0) return "adn.N." + rest.substr(5);
  if (rest.rfind("act.", 0) == 0) return "adn.A." + rest.substr(4);
  return rest;  // conv.weight, conv.bias
}

json monai_norm(NormKind k) {
  switch (k) {
    case NormKind::batch:
      return "batch";
    case NormKind::instance:
      return json::array({"instance", {{"affine", true}}});  // segflow's instance norm is affine
    case NormKind::none:
      return nullptr;
  }
  return nullptr;
}

json monai_act(ActKind k) {
  switch (k) {
    case ActKind::relu:
      return "relu";
    case ActKind::prelu:
      return "prelu";
    case ActKind::leakyrelu:
      return json::array({"leakyrelu", {{"negative_slope", ActOptions{}.negative_slope}}});
    case ActKind::gelu:
      return "gelu";
    case ActKind::none:
      return nullptr;
  }
  return nullptr;
}

/// Sizes as MONAI takes them: an integer, or a sequence in array order (z, y, x), the reverse
/// of segflow's (x, y, z).
json monai_sizes(const AxisSizes& s) {
  if (s.xyz().size() == 1) return s.xyz().front();
  return json(std::vector<std::int64_t>(s.xyz().rbegin(), s.xyz().rend()));
}

Result<ExportedModel> export_unet(const UNetOptions& o, const torch::nn::Module& module) {
  ExportedModel m;
  m.target = "monai.networks.nets.UNet";
  const std::size_t levels = o.channels.size() - 1;
  auto add = [&](const std::string& name, const at::Tensor& t) -> Status {
    SEGFLOW_ASSIGN_OR_RETURN(std::string monai, monai_unet_name(name, levels, o.num_res_units));
    m.state_dict.emplace_back("model." + monai, t.detach().to(at::kCPU).contiguous());
    return Status::ok();
  };
  for (const auto& p : module.named_parameters()) SEGFLOW_RETURN_IF_ERROR(add(p.key(), p.value()));
  for (const auto& b : module.named_buffers()) SEGFLOW_RETURN_IF_ERROR(add(b.key(), b.value()));
  json strides = json::array();
  for (const auto& st : o.strides) strides.push_back(monai_sizes(st));
  m.spec = {{"target", m.target},
            {"args",
             {{"spatial_dims", o.spatial_dims},
              {"in_channels", o.in_channels},
              {"out_channels", o.out_channels},
              {"channels", o.channels},
              {"strides", strides},
              {"kernel_size", monai_sizes(o.kernel_size)},
              {"up_kernel_size", monai_sizes(o.up_kernel_size)},
              {"num_res_units", o.num_res_units},
              {"act", monai_act(o.act)},
              {"norm", monai_norm(o.norm)},
              {"dropout", o.dropout},
              {"bias", o.bias}}}};
  return m;
}

Result<ExportedModel> export_sam(const SamOptions& o, const torch::nn::Module& module) {
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

/// nnU-Net's sizes per stage in array order (z, y, x), every axis spelled out.
json nnunet_sizes(const std::vector<AxisSizes>& sizes, int dims) {
  json out = json::array();
  for (const auto& s : sizes) {
    json axes = json::array();
    for (int a = dims - 1; a >= 0; --a) axes.push_back(s.axis(static_cast<std::size_t>(a)));
    out.push_back(axes);
  }
  return out;
}

Result<ExportedModel> export_plain_unet(const PlainConvUNetOptions& o, const torch::nn::Module& module) {
  if (o.norm == NormKind::none)
    return invalid_argument(
        "export --to pytorch: plain_unet with norm none has no dynamic_network_architectures layout handled "
        "here; expected norm instance or batch");
  ExportedModel m;
  m.target = "dynamic_network_architectures.architectures.unet.PlainConvUNet";
  auto add = [&](const std::string& name, const at::Tensor& t) -> Status {
    SEGFLOW_ASSIGN_OR_RETURN(std::vector<std::string> names, nnunet_plain_names(name));
    for (const auto& n : names) m.state_dict.emplace_back(n, t.detach().to(at::kCPU).contiguous());
    return Status::ok();
  };
  for (const auto& p : module.named_parameters()) SEGFLOW_RETURN_IF_ERROR(add(p.key(), p.value()));
  for (const auto& b : module.named_buffers()) SEGFLOW_RETURN_IF_ERROR(add(b.key(), b.value()));
  const std::string d = std::to_string(o.spatial_dims) + "d";
  const bool instance = o.norm == NormKind::instance;
  json norm_kwargs = {{"eps", 1e-5}, {"affine", true}};
  m.spec = {{"target", m.target},
            {"args",
             {{"input_channels", o.in_channels},
              {"n_stages", o.n_stages},
              {"features_per_stage", o.features()},
              {"conv_op", "Conv" + d},
              {"kernel_sizes", nnunet_sizes(o.resolved_kernel_sizes(), o.spatial_dims)},
              {"strides", nnunet_sizes(o.resolved_strides(), o.spatial_dims)},
              {"n_conv_per_stage", o.n_conv_per_stage},
              {"num_classes", o.num_classes},
              {"n_conv_per_stage_decoder", o.n_conv_per_stage_decoder},
              {"conv_bias", o.conv_bias},
              {"norm_op", (instance ? "InstanceNorm" : "BatchNorm") + d},
              {"norm_op_kwargs", norm_kwargs},
              {"nonlin", "LeakyReLU"},
              {"nonlin_kwargs", {{"negative_slope", o.negative_slope}, {"inplace", true}}},
              {"deep_supervision", o.deep_supervision}}}};
  return m;
}

}  // namespace

Result<std::vector<std::string>> nnunet_plain_names(const std::string& name) {
  static const std::regex kEncoder(R"(encoder_stages\.(\d+)\.(\d+)\.(conv|norm)\.(\w+))");
  static const std::regex kDecoder(R"(decoder_stages\.(\d+)\.(\d+)\.(conv|norm)\.(\w+))");
  static const std::regex kOther(R"((transpconvs|seg_layers)\.(\d+)\.(\w+))");
  std::smatch m;
  // A conv block's conv and norm are also all_modules.0 and .1 (no dropout); the decoder
  // holds the encoder again as decoder.encoder.
  auto block = [&](const std::string& stem) {
    const std::string leaf = m[4].str();
    return std::vector<std::string>{stem + m[3].str() + "." + leaf,
                                    stem + "all_modules." + (m[3] == "conv" ? "0." : "1.") + leaf};
  };
  if (std::regex_match(name, m, kEncoder)) {
    auto names = block("encoder.stages." + m[1].str() + ".0.convs." + m[2].str() + ".");
    names.push_back("decoder." + names[0]);
    names.push_back("decoder." + names[1]);
    return names;
  }
  if (std::regex_match(name, m, kDecoder))
    return block("decoder.stages." + m[1].str() + ".convs." + m[2].str() + ".");
  if (std::regex_match(name, m, kOther))
    return std::vector<std::string>{"decoder." + m[1].str() + "." + m[2].str() + "." + m[3].str()};
  return invalid_argument("export: '" + name + "' is not a PlainConvUNet tensor");
}

Result<std::string> monai_unet_name(const std::string& name, std::size_t levels, std::int64_t num_res_units) {
  static const std::regex kLevel(R"((down|up)\.(\d+)\.(.+))");
  auto nested = [](std::size_t level) {
    std::string s;
    for (std::size_t i = 0; i < level; ++i) s += "1.submodule.";
    return s;
  };
  // A ResidualUnit's own names: conv.K.* are MONAI's conv.unitK.*; without residual units
  // segflow still wraps the single block as conv.0, where MONAI has the Convolution itself.
  auto unit = [&](const std::string& rest) -> Result<std::string> {
    static const std::regex kSub(R"(conv\.(\d+)\.(.+))");
    std::smatch m;
    if (std::regex_match(rest, m, kSub)) {
      if (num_res_units == 0) {
        if (m[1] != "0") return invalid_argument("export: unexpected UNet tensor '" + rest + "'");
        return monai_adn(m[2]);
      }
      return "conv.unit" + m[1].str() + "." + monai_adn(m[2]);
    }
    if (rest.rfind("residual.", 0) == 0 && num_res_units > 0) return rest;
    return invalid_argument("export: unexpected UNet tensor '" + rest + "'");
  };
  if (name.rfind("bottom.", 0) == 0) {
    SEGFLOW_ASSIGN_OR_RETURN(std::string u, unit(name.substr(7)));
    return nested(levels) + u;
  }
  std::smatch m;
  if (!std::regex_match(name, m, kLevel))
    return invalid_argument("export: '" + name + "' is not a UNet tensor");
  const std::size_t level = std::stoul(m[2]);
  if (level >= levels) return invalid_argument("export: '" + name + "' is past the UNet's levels");
  const std::string rest = m[3];
  if (m[1] == "down") {
    SEGFLOW_ASSIGN_OR_RETURN(std::string u, unit(rest));
    return nested(level) + "0." + u;
  }
  // Up: MONAI's up layer is Sequential(transposed Convolution, ResidualUnit) with residual
  // units, the transposed Convolution alone without.
  if (rest.rfind("conv.", 0) == 0)
    return nested(level) + (num_res_units > 0 ? "2.0." : "2.") + monai_adn(rest.substr(5));
  if (rest.rfind("ru.", 0) == 0 && num_res_units > 0) {
    SEGFLOW_ASSIGN_OR_RETURN(std::string u, unit(rest.substr(3)));
    return nested(level) + "2.1." + u;
  }
  return invalid_argument("export: unexpected UNet tensor '" + name + "'");
}

Result<ExportedModel> export_model(const ModelOptions& options, const torch::nn::Module& module) {
  if (const auto* u = std::get_if<UNetOptions>(&options.net)) return export_unet(*u, module);
  if (const auto* s = std::get_if<SamModelOptions>(&options.net)) return export_sam(s->sam, module);
  return export_plain_unet(std::get<PlainConvUNetOptions>(options.net), module);
}

std::vector<char> torch_save_bytes(const c10::IValue& value) {
  // torch::pickle_save tags typed dicts with torch.jit's restore_type_tag, which torch.load's
  // default weights_only unpickler refuses; so the archive torch.save writes is made here:
  // data.pkl (plain dicts, lists, tuples, strings, numbers, None and tensors, each tensor a
  // persistent id naming its storage record), byteorder and data/<i>, in the zip container
  // torch.load reads.
  std::vector<char> pickled;
  torch::jit::Pickler pickler([&](const char* b, std::size_t n) { pickled.insert(pickled.end(), b, b + n); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr,
                              /*memoized_class_types=*/nullptr, /*get_tensor_id=*/nullptr,
                              /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  std::vector<char> out;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* b, std::size_t n) {
    out.insert(out.end(), static_cast<const char*>(b), static_cast<const char*>(b) + n);
    return n;
  });
  writer.writeRecord("data.pkl", pickled.data(), pickled.size());
  static constexpr std::string_view kOrder = "little";
  writer.writeRecord("byteorder", kOrder.data(), kOrder.size());
  std::size_t i = 0;
  for (const at::Tensor& t : pickler.tensorData()) {
    const auto data = torch::jit::getWriteableTensorData(t);
    writer.writeRecord("data/" + std::to_string(i++), data.data(), data.sizeInBytes());
  }
  writer.writeEndOfFile();
  return out;
}

c10::Dict<std::string, at::Tensor> cpu_tensor_dict(
    const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, t] : tensors) dict.insert(name, t.detach().to(at::kCPU).contiguous().clone());
  return dict;
}

std::vector<char> pytorch_state_dict_bytes(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  return torch_save_bytes(c10::IValue(cpu_tensor_dict(tensors)));
}

Status write_pytorch_export(const ExportedModel& model, const std::filesystem::path& out) {
  const std::vector<char> bytes = pytorch_state_dict_bytes(model.state_dict);
  SEGFLOW_RETURN_IF_ERROR(write_file_atomically(out, std::string_view(bytes.data(), bytes.size())));
  std::filesystem::path spec = out;
  spec.replace_extension(".json");
  return write_file_atomically(spec, model.spec.dump(2) + '\n');
}

}  // namespace segflow::models
