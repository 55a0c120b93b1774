#include "models/nets/registry.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <regex>

#include "models/nets/weights.hpp"
#include "pipeline/options.hpp"
#include "pipeline/pipeline_spec.hpp"

namespace segflow::models {
namespace {

using pipeline::OptionParser;
using pipeline::Range;

void bind_norm(OptionParser& p, NormKind& norm, const char* doc) {
  std::string s = to_string(norm);
  p.choice("norm", s, {"batch", "instance", "none"}, doc);
  if (auto n = parse_norm(s); n.is_ok()) norm = *n;
}

/// "an integer or 3 integers (x, y, z)".
std::string axis_sizes_expected(int spatial_dims) {
  return "an integer or " + std::to_string(spatial_dims) + " integers " + axis_order_text(spatial_dims);
}

/// `v` as AxisSizes: an integer (YAML may write 2.0), or a list of spatial_dims integers.
/// Values are range-checked by the options' validate(), which names the field.
bool read_axis_sizes(const nlohmann::json& v, int spatial_dims, AxisSizes& out) {
  auto as_integer = [](const nlohmann::json& e, std::int64_t& i) {
    if (e.is_number_integer()) {
      i = e.get<std::int64_t>();
      return true;
    }
    if (!e.is_number_float()) return false;
    const double d = e.get<double>();
    if (d != std::floor(d) || std::abs(d) > 9e15) return false;
    i = static_cast<std::int64_t>(d);
    return true;
  };
  std::int64_t i = 0;
  if (as_integer(v, i)) {
    out = AxisSizes(i);
    return true;
  }
  if (!v.is_array() || v.size() != static_cast<std::size_t>(spatial_dims)) return false;
  std::vector<std::int64_t> xyz;
  for (const auto& e : v) {
    if (!as_integer(e, i)) return false;
    xyz.push_back(i);
  }
  out = AxisSizes(std::move(xyz));
  return true;
}

/// One size for every axis or one per axis in (x, y, z) order.
void axis_sizes(OptionParser& p, const char* key, AxisSizes& field, int spatial_dims, const char* doc) {
  nlohmann::json v = field;
  p.json_value(key, v, "integer or list of integers (x, y, z)", doc);
  if (!p.given(key)) return;
  if (!read_axis_sizes(v, spatial_dims, field))
    return p.fail(key,
                  "expected " + axis_sizes_expected(spatial_dims) + ", got " + pipeline::format_value(v));
  p.set_resolved(key, field);
}

/// A list (per level or stage) of sizes, each one for every axis or one per axis (x, y, z);
/// a bad entry is named: "model.strides[2]: expected an integer or 3 integers (x, y, z), ...".
void axis_sizes_list(OptionParser& p, const char* key, std::vector<AxisSizes>& field, int spatial_dims,
                     const char* doc) {
  nlohmann::json v = field;
  p.json_value(key, v, "list of (integer or list of integers (x, y, z))", doc);
  if (!p.given(key)) return;
  if (!v.is_array())
    return p.fail(key, "expected a list, each entry " + axis_sizes_expected(spatial_dims) + ", got " +
                           pipeline::format_value(v));
  std::vector<AxisSizes> out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    AxisSizes a;
    if (!read_axis_sizes(v[i], spatial_dims, a))
      return p.fail(
          std::string(key) + "[" + std::to_string(i) + "]",
          "expected " + axis_sizes_expected(spatial_dims) + ", got " + pipeline::format_value(v[i]));
    out.push_back(std::move(a));
  }
  field = std::move(out);
  p.set_resolved(key, field);
}

void bind(OptionParser& p, UNetOptions& o) {
  p.integer("spatial_dims", o.spatial_dims, Range::closed(2, 3), "", "2D (Y, X) or 3D (Z, Y, X) inputs");
  p.integer("in_channels", o.in_channels, Range::at_least(1), "channels", "input image channels");
  p.integer("out_channels", o.out_channels, Range::at_least(1), "channels",
            "output logit channels (classes incl. background)");
  p.integer_list("channels", o.channels, Range::at_least(1), false, "features per level, >= 2 levels");
  axis_sizes_list(p, "strides", o.strides, o.spatial_dims,
                  "downsampling between levels (len(channels) - 1 entries), each an integer or one per "
                  "axis in (x, y, z) order");
  axis_sizes(p, "kernel_size", o.kernel_size, o.spatial_dims,
             "conv kernel size in voxels (odd): an integer or one per axis (x, y, z)");
  axis_sizes(p, "up_kernel_size", o.up_kernel_size, o.spatial_dims,
             "transposed-conv kernel size in voxels (odd): an integer or one per axis (x, y, z)");
  p.integer("num_res_units", o.num_res_units, Range::non_negative(), "",
            "residual units per block; 0 = plain conv blocks");
  bind_norm(p, o.norm, "normalisation: batch, instance (affine) or none");
  std::string act = to_string(o.act);
  p.choice("act", act, {"relu", "prelu", "leakyrelu", "none"}, "activation");
  if (auto a = parse_act(act); a.is_ok()) o.act = *a;
  p.number("dropout", o.dropout, Range{0.0, 1.0, false, true}, "", "dropout probability");
  p.boolean("bias", o.bias, "conv biases");
  if (p.ok()) p.check(o.validate(), "unet");
}

void bind(OptionParser& p, PlainConvUNetOptions& o) {
  p.integer("spatial_dims", o.spatial_dims, Range::closed(2, 3), "", "2D (Y, X) or 3D (Z, Y, X) inputs");
  p.integer("in_channels", o.in_channels, Range::at_least(1), "channels", "input image channels");
  p.integer("out_channels", o.num_classes, Range::at_least(1), "channels", "classes incl. background");
  p.integer("n_stages", o.n_stages, Range::at_least(2), "", "encoder stages");
  p.integer("base_features", o.base_features, Range::at_least(1), "channels",
            "features of stage 0, doubled per stage");
  p.integer("max_features", o.max_features, Range::at_least(1), "channels",
            "cap on the features per stage (>= base_features)");
  p.integer("n_conv_per_stage", o.n_conv_per_stage, Range::at_least(1), "", "encoder convs per stage");
  p.integer("n_conv_per_stage_decoder", o.n_conv_per_stage_decoder, Range::at_least(1), "",
            "decoder convs per stage");
  p.integer("kernel_size", o.kernel_size, Range::at_least(1), "voxels",
            "conv kernel size (odd) of every stage unless kernel_sizes is given");
  axis_sizes_list(p, "kernel_sizes", o.kernel_sizes, o.spatial_dims,
                  "conv kernel per stage (n_stages entries, odd), each an integer or one per axis in "
                  "(x, y, z) order; [] = kernel_size everywhere");
  axis_sizes_list(p, "strides", o.strides, o.spatial_dims,
                  "stride per stage (n_stages entries), each an integer or one per axis in (x, y, z) "
                  "order; [] = 1, 2, 2, ...");
  p.boolean("deep_supervision", o.deep_supervision, "one output per decoder stage");
  p.boolean("conv_bias", o.conv_bias, "conv biases");
  p.number("negative_slope", o.negative_slope, Range::non_negative(), "", "LeakyReLU slope");
  bind_norm(p, o.norm, "normalisation: instance (affine, nnU-Net's), batch or none");
  if (p.ok()) p.check(o.validate(), "plain_unet");
}

void bind(OptionParser& p, SamModelOptions& m) {
  p.choice("preset", m.preset, SamOptions::preset_names(),
           "the base every other key overrides: tiny, small or vit_b (SAM ViT-B)");
  if (p.given("preset") && p.ok()) m.sam = SamOptions::preset(m.preset).value();
  int dims = 2;
  std::int64_t out = 1;
  p.integer("spatial_dims", dims, Range::any(), "", "2 (sam is a 2D model)");
  if (dims != 2) p.fail("spatial_dims", "expected 2 (sam is a 2D model), got " + std::to_string(dims));
  p.integer("out_channels", out, Range::any(), "channels", "1 (one mask per box, sigmoid logits)");
  if (out != 1)
    p.fail("out_channels", "expected 1 (one mask per box, sigmoid logits), got " + std::to_string(out));
  auto& e = m.sam.image_encoder;
  auto& d = m.sam.mask_decoder;
  p.integer("in_channels", e.in_chans, Range::at_least(1), "channels", "image channels");
  p.integer("img_size", e.img_size, Range::at_least(1), "pixels",
            "input height = width (a multiple of patch_size)");
  p.integer("patch_size", e.patch_size, Range::at_least(1), "pixels", "patch side");
  p.integer("embed_dim", e.embed_dim, Range::at_least(1), "channels",
            "token width (a multiple of num_heads)");
  p.integer("depth", e.depth, Range::at_least(1), "", "transformer blocks of the image encoder");
  p.integer("num_heads", e.num_heads, Range::at_least(1), "", "attention heads of the image encoder");
  p.number("mlp_ratio", e.mlp_ratio, Range::positive(), "", "MLP hidden width / embed_dim");
  p.integer("out_chans", e.out_chans, Range::at_least(8), "channels",
            "neck output channels (a multiple of 8)");
  p.boolean("use_rel_pos", e.use_rel_pos, "SAM's decomposed relative positions");
  p.integer("window_size", e.window_size, Range::non_negative(), "patches",
            "windowed attention window; 0 = global attention everywhere");
  p.integer_list("global_attn_indexes", e.global_attn_indexes, Range::non_negative(), true,
                 "blocks with global attention when windowed (each < depth)");
  p.integer("decoder_depth", d.depth, Range::at_least(1), "", "two-way attention blocks of the mask decoder");
  p.integer("decoder_heads", d.num_heads, Range::at_least(1), "", "attention heads of the mask decoder");
  p.integer("decoder_mlp_dim", d.mlp_dim, Range::at_least(1), "channels", "mask decoder MLP width");
  p.integer("num_multimask_outputs", d.num_multimask_outputs, Range::non_negative(), "",
            "extra mask tokens (the output uses token 0)");
  p.boolean("iou_head", d.iou_head, "IoU prediction head (needed to load SAM weights)");
  p.boolean("freeze_image_encoder", e.frozen, "no gradients for the image encoder");
  p.boolean("freeze_prompt_encoder", m.sam.prompt_encoder.frozen,
            "no gradients for the prompt encoder (MedSAM)");
  p.boolean("freeze_mask_decoder", d.frozen, "no gradients for the mask decoder");
  m.sam.resolve();
  if (p.ok()) p.check(m.sam.validate(), "sam");
}

/// `model.weights` as a mapping: {path, names, skip, reinit_head, channels}.
struct WeightsSection {
  ModelOptions& m;
  void bind(OptionParser& p) {
    WeightsOptions& w = m.weights_options;
    p.string("path", m.weights, "segflow tensor archive (.sfta)");
    p.choice("names", w.names, weights_name_schemes(),
             "whose names the archive holds: auto, segflow, monai (MONAI's UNet), nnunet (PlainConvUNet)");
    p.strings("skip", w.skip, false, "regexes over segflow names: those tensors keep their fresh init");
    p.boolean("reinit_head", w.reinit_head, "the output layer keeps its fresh init (another class count)");
    p.choice("channels", w.channels, channel_adaptations(),
             "first-conv input-channel adaptation when the channel counts differ: none, repeat, mean");
    for (const auto& r : w.skip) {
      try {
        std::regex re(r, std::regex::ECMAScript);
      } catch (const std::regex_error& e) {
        p.fail("skip", "expected regular expressions, got '" + r + "' (" + e.what() + ")");
      }
    }
    if (p.ok() && m.weights.empty()) p.fail("path", "expected the path of a tensor archive, got nothing");
  }
};

/// `weights`: a path, or a mapping (resolved as a mapping when it holds more than a path).
void bind_weights(OptionParser& p, ModelOptions& m) {
  static constexpr const char* kDoc =
      "segflow tensor archive loaded after construction, or {path, names, skip, reinit_head, channels}; "
      "\"\" = none";
  const nlohmann::json* given = p.given("weights");
  if ((given && given->is_object()) || (!given && !m.weights_options.is_default())) {
    WeightsSection section{m};
    p.section("weights", section, kDoc);
  } else {
    p.string("weights", m.weights, kDoc);
  }
}

/// The network's keys, then the keys every model has.
template <class Net>
void bind_model(OptionParser& p, Net& net, ModelOptions& m) {
  bind(p, net);
  bind_weights(p, m);
  p.boolean("weights_strict", m.weights_strict, "every archive tensor must match a parameter or buffer");
}

/// Reads the keys of network `name` (a known model) and the common keys into `m`; the
/// parser's first error or unknown key.
Status read_model(const std::string& name, OptionParser& p, ModelOptions& m) {
  if (name == "unet")
    m.net = UNetOptions{};
  else if (name == "plain_unet")
    m.net = PlainConvUNetOptions{};
  else
    m.net = SamModelOptions{};
  std::visit([&](auto& net) { bind_model(p, net, m); }, m.net);
  return p.finish();
}

Result<ModelHandle> build(const UNetOptions& o) {
  SEGFLOW_RETURN_IF_ERROR(o.validate());  // before size_divisors() reads the strides
  ModelInfo info{"unet", o.spatial_dims,   o.in_channels, o.out_channels, false, false, o.size_divisor(),
                 0,      o.size_divisors()};
  auto m = UNet(o).ptr();
  return ModelHandle(info, m, [](torch::nn::Module& mod, const at::Tensor& x, const at::Tensor&) {
    return std::vector<at::Tensor>{static_cast<UNetImpl&>(mod).forward(x)};
  });
}

Result<ModelHandle> build(const PlainConvUNetOptions& o) {
  SEGFLOW_RETURN_IF_ERROR(o.validate());
  ModelInfo info{"plain_unet",
                 o.spatial_dims,
                 o.in_channels,
                 o.num_classes,
                 false,
                 o.deep_supervision,
                 o.size_divisor(),
                 0,
                 o.size_divisors()};
  auto m = PlainConvUNet(o).ptr();
  return ModelHandle(info, m, [](torch::nn::Module& mod, const at::Tensor& x, const at::Tensor&) {
    return static_cast<PlainConvUNetImpl&>(mod).forward(x);
  });
}

Result<ModelHandle> build(const SamModelOptions& so) {
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

Status check_input_size(const ModelInfo& info, const std::vector<std::int64_t>& xyz,
                        const std::string& field) {
  if (info.fixed_size > 0) return Status::ok();
  const auto& div = info.size_divisors;
  for (std::size_t a = 0; a < std::min(xyz.size(), div.size()); ++a) {
    if (xyz[a] <= 0 || xyz[a] % div[a] == 0) continue;
    const char axis[] = {"xyz"[a], '\0'};
    return invalid_config(field + ": expected a multiple of " + std::to_string(div[a]) + " on " + axis +
                          " (the product of model.strides on " + axis + "; per axis " +
                          axis_order_text(static_cast<int>(div.size())) + ": " +
                          pipeline::format_value(nlohmann::json(div)) + "), got " +
                          pipeline::format_value(nlohmann::json(xyz)));
  }
  return Status::ok();
}

Status check_input_sizes(const ModelInfo& info, const pipeline::PipelineSpec& stages,
                         const std::vector<std::int64_t>& roi_size, const std::string& label) {
  for (std::size_t i = 0; i < stages.stages.size(); ++i) {
    const auto& st = stages.stages[i];
    const auto it = st.options.find("spatial_size");
    if (st.name.find("crop") == std::string::npos || it == st.options.end()) continue;
    std::vector<std::int64_t> xyz;
    if (it->is_number_integer()) xyz.assign(3, it->get<std::int64_t>());
    if (it->is_array())
      for (const auto& v : *it) xyz.push_back(v.is_number_integer() ? v.get<std::int64_t>() : 0);
    SEGFLOW_RETURN_IF_ERROR(check_input_size(
        info, xyz, label + ": " + stages.path + "[" + std::to_string(i) + "].options.spatial_size"));
  }
  return check_input_size(info, roi_size, label + ": validation.roi_size");
}

std::string ModelOptions::name() const {
  switch (net.index()) {
    case 0:
      return "unet";
    case 1:
      return "plain_unet";
    default:
      return "sam";
  }
}

Result<ModelOptions> parse_model_options(const nlohmann::json& j, const std::string& where) {
  OptionParser p(j, where);
  std::string name;
  p.choice("name", name, known_models(),
           "the network: unet (MONAI's), plain_unet (nnU-Net's) or sam (box-prompted SAM)");
  if (p.ok() && !p.given("name"))
    p.fail("name", "expected a model name (unet, plain_unet, sam), got nothing");
  if (!p.ok()) return p.finish();  // which keys are known depends on the name
  ModelOptions m;
  SEGFLOW_RETURN_IF_ERROR(read_model(name, p, m));
  return m;
}

void to_json(nlohmann::json& j, const ModelOptions& options) {
  ModelOptions m = options;
  OptionParser p(nlohmann::json::object(), "");
  std::string name = m.name();
  p.choice("name", name, known_models(), "the network");
  std::visit([&](auto& net) { bind_model(p, net, m); }, m.net);
  j = p.resolved();
}

Result<ModelHandle> create_model(const ModelOptions& options, WeightsReport* report) {
  Result<ModelHandle> made = invalid_argument("");
  try {
    made = std::visit([](const auto& net) { return build(net); }, options.net);
  } catch (const std::exception& e) {
    return invalid_argument(options.name() + ": " + first_line(e));
  }
  if (!made.is_ok()) return made;
  if (!options.weights.empty()) {
    SEGFLOW_ASSIGN_OR_RETURN(
        WeightsReport r, load_pretrained(made->module(), options, options.weights, options.weights_options,
                                         options.weights_strict));
    if (report) *report = std::move(r);
  }
  return made;
}

Result<ModelHandle> create_model(const std::string& name, const nlohmann::json& options) {
  const auto known = known_models();
  if (std::find(known.begin(), known.end(), name) == known.end())
    return invalid_argument("model: unknown name '" + name + "'; known models: unet, plain_unet, sam");
  ModelOptions m;
  OptionParser p(options, name);
  SEGFLOW_RETURN_IF_ERROR(read_model(name, p, m));
  return create_model(m);
}

}  // namespace segflow::models
