#include "models/registry.hpp"

#include <nlohmann/json.hpp>

#include "models/detail/json_options.hpp"
#include "models/sam.hpp"
#include "models/unet.hpp"
#include "models/weights.hpp"

namespace segflow::models {
namespace {

const std::vector<std::string> kCommonKeys = {"spatial_dims", "in_channels", "out_channels", "weights",
                                              "weights_strict"};

std::vector<std::string> with_common(std::vector<std::string> keys) {
  keys.insert(keys.begin(), kCommonKeys.begin(), kCommonKeys.end());
  return keys;
}

Status read_norm(const detail::OptionReader& r, NormKind& out) {
  std::string s = to_string(out);
  SEGFLOW_RETURN_IF_ERROR(r.get("norm", s));
  auto n = parse_norm(s);
  if (!n.is_ok()) return n.status().with_context(r.where());
  out = *n;
  return Status::ok();
}

Result<ModelHandle> make_unet(const nlohmann::json& j) {
  detail::OptionReader r(j, "unet",
                         with_common({"channels", "strides", "kernel_size", "up_kernel_size", "num_res_units",
                                      "norm", "act", "dropout", "bias"}));
  SEGFLOW_RETURN_IF_ERROR(r.check_keys());
  UNetOptions o;
  SEGFLOW_RETURN_IF_ERROR(r.get("spatial_dims", o.spatial_dims));
  SEGFLOW_RETURN_IF_ERROR(r.get("in_channels", o.in_channels));
  SEGFLOW_RETURN_IF_ERROR(r.get("out_channels", o.out_channels));
  SEGFLOW_RETURN_IF_ERROR(r.get("channels", o.channels));
  SEGFLOW_RETURN_IF_ERROR(r.get("strides", o.strides));
  SEGFLOW_RETURN_IF_ERROR(r.get("kernel_size", o.kernel_size));
  SEGFLOW_RETURN_IF_ERROR(r.get("up_kernel_size", o.up_kernel_size));
  SEGFLOW_RETURN_IF_ERROR(r.get("num_res_units", o.num_res_units));
  SEGFLOW_RETURN_IF_ERROR(read_norm(r, o.norm));
  std::string act = to_string(o.act);
  SEGFLOW_RETURN_IF_ERROR(r.get("act", act));
  auto a = parse_act(act);
  if (!a.is_ok()) return a.status().with_context("unet");
  o.act = *a;
  SEGFLOW_RETURN_IF_ERROR(r.get("dropout", o.dropout));
  SEGFLOW_RETURN_IF_ERROR(r.get("bias", o.bias));
  SEGFLOW_RETURN_IF_ERROR(o.validate());
  ModelInfo info{"unet", o.spatial_dims, o.in_channels, o.out_channels, false, false, o.size_divisor(), 0};
  auto m = UNet(o).ptr();
  return ModelHandle(info, m, [](torch::nn::Module& mod, const at::Tensor& x, const at::Tensor&) {
    return std::vector<at::Tensor>{static_cast<UNetImpl&>(mod).forward(x)};
  });
}

Result<ModelHandle> make_plain_unet(const nlohmann::json& j) {
  detail::OptionReader r(j, "plain_unet",
                         with_common({"n_stages", "base_features", "max_features", "n_conv_per_stage",
                                      "n_conv_per_stage_decoder", "kernel_size", "strides",
                                      "deep_supervision", "conv_bias", "negative_slope", "norm"}));
  SEGFLOW_RETURN_IF_ERROR(r.check_keys());
  PlainConvUNetOptions o;
  SEGFLOW_RETURN_IF_ERROR(r.get("spatial_dims", o.spatial_dims));
  SEGFLOW_RETURN_IF_ERROR(r.get("in_channels", o.in_channels));
  SEGFLOW_RETURN_IF_ERROR(r.get("out_channels", o.num_classes));
  SEGFLOW_RETURN_IF_ERROR(r.get("n_stages", o.n_stages));
  SEGFLOW_RETURN_IF_ERROR(r.get("base_features", o.base_features));
  SEGFLOW_RETURN_IF_ERROR(r.get("max_features", o.max_features));
  SEGFLOW_RETURN_IF_ERROR(r.get("n_conv_per_stage", o.n_conv_per_stage));
  SEGFLOW_RETURN_IF_ERROR(r.get("n_conv_per_stage_decoder", o.n_conv_per_stage_decoder));
  SEGFLOW_RETURN_IF_ERROR(r.get("kernel_size", o.kernel_size));
  SEGFLOW_RETURN_IF_ERROR(r.get("strides", o.strides));
  SEGFLOW_RETURN_IF_ERROR(r.get("deep_supervision", o.deep_supervision));
  SEGFLOW_RETURN_IF_ERROR(r.get("conv_bias", o.conv_bias));
  SEGFLOW_RETURN_IF_ERROR(r.get("negative_slope", o.negative_slope));
  SEGFLOW_RETURN_IF_ERROR(read_norm(r, o.norm));
  SEGFLOW_RETURN_IF_ERROR(o.validate());
  ModelInfo info{"plain_unet", o.spatial_dims,     o.in_channels,    o.num_classes,
                 false,        o.deep_supervision, o.size_divisor(), 0};
  auto m = PlainConvUNet(o).ptr();
  return ModelHandle(info, m, [](torch::nn::Module& mod, const at::Tensor& x, const at::Tensor&) {
    return static_cast<PlainConvUNetImpl&>(mod).forward(x);
  });
}

Result<ModelHandle> make_sam(const nlohmann::json& j) {
  detail::OptionReader r(
      j, "sam",
      with_common({"preset", "img_size", "patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio",
                   "out_chans", "use_rel_pos", "window_size", "global_attn_indexes", "decoder_depth",
                   "decoder_heads", "decoder_mlp_dim", "num_multimask_outputs", "iou_head",
                   "freeze_image_encoder", "freeze_prompt_encoder", "freeze_mask_decoder"}));
  SEGFLOW_RETURN_IF_ERROR(r.check_keys());
  std::string preset = "tiny";
  SEGFLOW_RETURN_IF_ERROR(r.get("preset", preset));
  SEGFLOW_ASSIGN_OR_RETURN(SamOptions o, SamOptions::preset(preset));
  int spatial_dims = 2;
  int64_t out_channels = 1;
  SEGFLOW_RETURN_IF_ERROR(r.get("spatial_dims", spatial_dims));
  SEGFLOW_RETURN_IF_ERROR(r.get("out_channels", out_channels));
  if (spatial_dims != 2) return r.bad("spatial_dims", "2 (sam is a 2D model)", spatial_dims);
  if (out_channels != 1) return r.bad("out_channels", "1 (one mask per box, sigmoid logits)", out_channels);
  auto& e = o.image_encoder;
  auto& d = o.mask_decoder;
  SEGFLOW_RETURN_IF_ERROR(r.get("in_channels", e.in_chans));
  SEGFLOW_RETURN_IF_ERROR(r.get("img_size", e.img_size));
  SEGFLOW_RETURN_IF_ERROR(r.get("patch_size", e.patch_size));
  SEGFLOW_RETURN_IF_ERROR(r.get("embed_dim", e.embed_dim));
  SEGFLOW_RETURN_IF_ERROR(r.get("depth", e.depth));
  SEGFLOW_RETURN_IF_ERROR(r.get("num_heads", e.num_heads));
  SEGFLOW_RETURN_IF_ERROR(r.get("mlp_ratio", e.mlp_ratio));
  SEGFLOW_RETURN_IF_ERROR(r.get("out_chans", e.out_chans));
  SEGFLOW_RETURN_IF_ERROR(r.get("use_rel_pos", e.use_rel_pos));
  SEGFLOW_RETURN_IF_ERROR(r.get("window_size", e.window_size));
  SEGFLOW_RETURN_IF_ERROR(r.get("global_attn_indexes", e.global_attn_indexes));
  SEGFLOW_RETURN_IF_ERROR(r.get("decoder_depth", d.depth));
  SEGFLOW_RETURN_IF_ERROR(r.get("decoder_heads", d.num_heads));
  SEGFLOW_RETURN_IF_ERROR(r.get("decoder_mlp_dim", d.mlp_dim));
  SEGFLOW_RETURN_IF_ERROR(r.get("num_multimask_outputs", d.num_multimask_outputs));
  SEGFLOW_RETURN_IF_ERROR(r.get("iou_head", d.iou_head));
  SEGFLOW_RETURN_IF_ERROR(r.get("freeze_image_encoder", e.frozen));
  SEGFLOW_RETURN_IF_ERROR(r.get("freeze_prompt_encoder", o.prompt_encoder.frozen));
  SEGFLOW_RETURN_IF_ERROR(r.get("freeze_mask_decoder", d.frozen));
  o.resolve();
  SEGFLOW_RETURN_IF_ERROR(o.validate());
  ModelInfo info{"sam", 2, e.in_chans, 1, true, false, e.patch_size, e.img_size};
  auto m = Sam(o).ptr();
  return ModelHandle(info, m, [](torch::nn::Module& mod, const at::Tensor& x, const at::Tensor& box) {
    TORCH_CHECK(box.defined(), "sam: forward needs a box tensor (N, 4)");
    return std::vector<at::Tensor>{static_cast<SamImpl&>(mod).forward(x, box)};
  });
}

}  // namespace

ModelHandle::ModelHandle(ModelInfo info, std::shared_ptr<torch::nn::Module> module, ForwardFn forward)
    : info_(std::move(info)), module_(std::move(module)), forward_(std::move(forward)) {}

std::vector<at::Tensor> ModelHandle::forward(const at::Tensor& image, const at::Tensor& box) const {
  return forward_(*module_, image, box);
}

at::Tensor ModelHandle::predict(const at::Tensor& image, const at::Tensor& box) const {
  return forward(image, box).front();
}

ModelHandle ModelHandle::clone(const std::optional<c10::Device>& device) const {
  return ModelHandle(info_, module_->clone(device), forward_);
}

std::vector<at::Tensor> ModelHandle::trainable_parameters() const {
  std::vector<at::Tensor> out;
  for (const auto& p : module_->parameters())
    if (p.requires_grad()) out.push_back(p);
  return out;
}

std::vector<std::string> known_models() { return {"unet", "plain_unet", "sam"}; }

Result<ModelHandle> create_model(const std::string& name, const nlohmann::json& options) {
  if (!options.is_null() && !options.is_object())
    return invalid_argument("model options: expected an object, got " + options.dump());
  Result<ModelHandle> made = invalid_argument("");
  try {
    if (name == "unet")
      made = make_unet(options);
    else if (name == "plain_unet")
      made = make_plain_unet(options);
    else if (name == "sam")
      made = make_sam(options);
    else
      return invalid_argument("model: unknown name '" + name + "'; known models: unet, plain_unet, sam");
  } catch (const std::exception& e) {
    return invalid_argument(name + ": " + e.what());
  }
  if (!made.is_ok()) return made;
  detail::OptionReader r(options, name, {});
  std::string weights;
  bool strict = true;
  SEGFLOW_RETURN_IF_ERROR(r.get("weights", weights));
  SEGFLOW_RETURN_IF_ERROR(r.get("weights_strict", strict));
  if (!weights.empty()) {
    SEGFLOW_ASSIGN_OR_RETURN(auto tensors, read_tensor_archive(weights));
    SEGFLOW_RETURN_IF_ERROR(load_into(made->module(), tensors, strict).with_context(weights));
  }
  return made;
}

}  // namespace segflow::models
