#include "models/nets/plain_unet.hpp"

#include <torch/nn/module.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <ostream>

#include "models/nets/nnunet_names.hpp"
#include "models/nets/recompute.hpp"
#include "pipeline/options.hpp"

namespace segflow::models {

// --------------------------------------------------------------------- PlainConvUNetOptions

Status ConvUNetTopology::validate_topology(const std::string& net) const {
  auto bad = [&net](const std::string& field, const std::string& expected, const std::string& got) {
    return invalid_argument(net + ": " + field + ": expected " + expected + ", got " + got);
  };
  if (spatial_dims != 2 && spatial_dims != 3)
    return bad("spatial_dims", "2 or 3", std::to_string(spatial_dims));
  if (in_channels < 1) return bad("in_channels", ">= 1", std::to_string(in_channels));
  if (num_classes < 1) return bad("num_classes", ">= 1", std::to_string(num_classes));
  if (n_stages < 2) return bad("n_stages", ">= 2", std::to_string(n_stages));
  if (base_features < 1) return bad("base_features", ">= 1", std::to_string(base_features));
  if (max_features < base_features)
    return bad("max_features", ">= base_features", std::to_string(max_features));
  if (n_conv_per_stage_decoder < 1)
    return bad("n_conv_per_stage_decoder", ">= 1", std::to_string(n_conv_per_stage_decoder));
  if (kernel_size < 1 || kernel_size % 2 == 0)
    return bad("kernel_size", "an odd number >= 1", std::to_string(kernel_size));
  if (!kernel_sizes.empty() && static_cast<int64_t>(kernel_sizes.size()) != n_stages)
    return bad("kernel_sizes", std::to_string(n_stages) + " entries (one per stage)",
               to_string(kernel_sizes));
  if (auto e = first_axis_sizes_error("kernel_sizes", kernel_sizes, spatial_dims, true); !e.empty())
    return invalid_argument(net + ": " + e);
  if (!strides.empty() && static_cast<int64_t>(strides.size()) != n_stages)
    return bad("strides", std::to_string(n_stages) + " entries (one per stage)", to_string(strides));
  if (auto e = first_axis_sizes_error("strides", strides, spatial_dims, false); !e.empty())
    return invalid_argument(net + ": " + e);
  if (auto e = divisor_error("strides", strides, spatial_dims); !e.empty())
    return invalid_argument(net + ": " + e);
  if (strides.empty() && n_stages > 21)  // the default 1, 2, 2, ...: a divisor of 2^(n_stages - 1)
    return bad("n_stages",
               "at most 21 with the default strides (inputs must be multiples of 2^(n_stages - 1))",
               std::to_string(n_stages));
  if (!(negative_slope >= 0.0)) return bad("negative_slope", ">= 0", std::to_string(negative_slope));
  return Status::ok();
}

Status PlainConvUNetOptions::validate() const {
  if (n_conv_per_stage < 1)
    return invalid_argument("plain_unet: n_conv_per_stage: expected >= 1, got " +
                            std::to_string(n_conv_per_stage));
  return validate_topology("plain_unet");
}

std::vector<int64_t> ConvUNetTopology::features() const {
  std::vector<int64_t> f;
  int64_t c = base_features;
  for (int64_t s = 0; s < n_stages; ++s) {
    f.push_back(std::min(c, max_features));
    c = std::min(c * 2, max_features);
  }
  return f;
}

std::vector<AxisSizes> ConvUNetTopology::resolved_strides() const {
  if (!strides.empty()) return strides;
  std::vector<AxisSizes> s(static_cast<size_t>(std::max<int64_t>(n_stages, 1)), 2);
  s[0] = 1;
  return s;
}

std::vector<AxisSizes> ConvUNetTopology::resolved_kernel_sizes() const {
  if (!kernel_sizes.empty()) return kernel_sizes;
  return std::vector<AxisSizes>(static_cast<size_t>(std::max<int64_t>(n_stages, 0)), kernel_size);
}

std::vector<int64_t> ConvUNetTopology::size_divisors() const {
  return axis_products(resolved_strides(), spatial_dims);
}

int64_t ConvUNetTopology::size_divisor() const { return lcm_of(size_divisors()); }

// --------------------------------------------------------------------------- PlainConvUNet

PlainConvUNetImpl::PlainConvUNetImpl(PlainConvUNetOptions o) : options(std::move(o)) { reset(); }

void PlainConvUNetImpl::reset() {
  const auto& o = options;
  auto st = o.validate();
  TORCH_CHECK(st.is_ok(), st.message());
  const auto feats = o.features();
  const auto strides = o.resolved_strides();
  const auto kernels = o.resolved_kernel_sizes();
  const auto n = static_cast<size_t>(o.n_stages);
  auto block = [&](int64_t inc, int64_t outc, const DimSizes& kernel, const DimSizes& stride) {
    ConvBlockOptions b;
    b.conv = ConvOptions{o.spatial_dims, inc, outc, kernel, stride, -1, 0, false, o.conv_bias};
    b.norm = o.norm;
    b.act = ActOptions{ActKind::leakyrelu, o.negative_slope};
    return ConvBlock(b);
  };
  // A stage: `count` blocks, the first strided (in tensor order: the options are (x, y, z)).
  auto stack = [&](int64_t count, int64_t inc, int64_t outc, const AxisSizes& kernel,
                   const AxisSizes& stride) {
    torch::nn::ModuleList l;
    for (int64_t i = 0; i < count; ++i)
      l->push_back(block(i == 0 ? inc : outc, outc, kernel.dims(), i == 0 ? stride.dims() : DimSizes(1)));
    return l;
  };
  encoder_stages = register_module("encoder_stages", torch::nn::ModuleList());
  for (size_t s = 0; s < n; ++s) {
    encoder_stages->push_back(
        stack(o.n_conv_per_stage, s == 0 ? o.in_channels : feats[s - 1], feats[s], kernels[s], strides[s]));
  }
  transpconvs = register_module("transpconvs", torch::nn::ModuleList());
  decoder_stages = register_module("decoder_stages", torch::nn::ModuleList());
  seg_layers = register_module("seg_layers", torch::nn::ModuleList());
  // Decoder stage s - 1 (lowest resolution first): upsample by the stride of stage n - s, join
  // the skip of stage n - s - 1 and convolve with that stage's kernel (nnU-Net's UNetDecoder).
  for (size_t s = 1; s < n; ++s) {
    const int64_t below = feats[n - s], skip = feats[n - s - 1];
    const DimSizes stride = strides[n - s].dims();
    transpconvs->push_back(ConvNd(
        ConvOptions{o.spatial_dims, below, skip, stride, stride, 0, 0, /*transposed=*/true, o.conv_bias}));
    decoder_stages->push_back(stack(o.n_conv_per_stage_decoder, 2 * skip, skip, kernels[n - s - 1], 1));
    seg_layers->push_back(ConvNd(ConvOptions{o.spatial_dims, skip, o.num_classes, 1, 1, 0, 0, false, true}));
  }
}

std::vector<at::Tensor> PlainConvUNetImpl::forward(const at::Tensor& x) {
  check_network_input("PlainConvUNet", x, options.spatial_dims, options.in_channels, options.size_divisors());
  auto run = [](torch::nn::ModuleListImpl& l, at::Tensor h) {
    for (size_t i = 0; i < l.size(); ++i) h = l.at<ConvBlockImpl>(i).forward(h);
    return h;
  };
  std::vector<at::Tensor> skips;
  at::Tensor h = x;
  // Each stage through recompute_stage: with train.activation_checkpointing only the stage
  // inputs are kept for backward (models/nets/recompute.hpp).
  for (size_t s = 0; s < encoder_stages->size(); ++s) {
    auto& stage = encoder_stages->at<torch::nn::ModuleListImpl>(s);
    h = recompute_stage(
        stage, [&stage, run](const at::Tensor& t) { return run(stage, t); }, h);
    skips.push_back(h);
  }
  std::vector<at::Tensor> outs;
  const size_t nd = decoder_stages->size();
  for (size_t d = 0; d < nd; ++d) {
    h = transpconvs->at<ConvNdImpl>(d).forward(h);
    h = at::cat({h, skips[nd - 1 - d]}, 1);
    auto& stage = decoder_stages->at<torch::nn::ModuleListImpl>(d);
    h = recompute_stage(
        stage, [&stage, run](const at::Tensor& t) { return run(stage, t); }, h);
    if (options.deep_supervision || d == nd - 1) outs.push_back(seg_layers->at<ConvNdImpl>(d).forward(h));
  }
  std::reverse(outs.begin(), outs.end());
  return outs;
}

void PlainConvUNetImpl::pretty_print(std::ostream& s) const {
  const auto& o = options;
  s << "segflow::models::PlainConvUNet(spatial_dims=" << o.spatial_dims << ", in_channels=" << o.in_channels
    << ", num_classes=" << o.num_classes << ", features=" << sizes_text(o.features())
    << ", strides=" << to_string(o.resolved_strides())
    << ", kernel_sizes=" << to_string(o.resolved_kernel_sizes())
    << ", n_conv_per_stage=" << o.n_conv_per_stage
    << ", deep_supervision=" << (o.deep_supervision ? "true" : "false") << ")";
}

// ------------------------------------------------------------ what both nnU-Net UNets share

void bind_conv_unet_topology(pipeline::OptionParser& p, ConvUNetTopology& o) {
  p.integer("spatial_dims", o.spatial_dims, pipeline::Range::closed(2, 3), "",
            "2D (Y, X) or 3D (Z, Y, X) inputs");
  p.integer("in_channels", o.in_channels, pipeline::Range::at_least(1), "channels", "input image channels");
  p.integer("out_channels", o.num_classes, pipeline::Range::at_least(1), "channels",
            "classes incl. background");
  p.integer("n_stages", o.n_stages, pipeline::Range::at_least(2), "", "encoder stages");
  p.integer("base_features", o.base_features, pipeline::Range::at_least(1), "channels",
            "features of stage 0, doubled per stage");
  p.integer("max_features", o.max_features, pipeline::Range::at_least(1), "channels",
            "cap on the features per stage (>= base_features)");
  p.integer("n_conv_per_stage_decoder", o.n_conv_per_stage_decoder, pipeline::Range::at_least(1), "",
            "decoder convs per stage");
  p.integer("kernel_size", o.kernel_size, pipeline::Range::at_least(1), "voxels",
            "conv kernel size (odd) of every stage unless kernel_sizes is given");
  bind_axis_sizes_list(p, "kernel_sizes", o.kernel_sizes, o.spatial_dims,
                       "conv kernel per stage (n_stages entries, odd), each an integer or one per axis in "
                       "(x, y, z) order; [] = kernel_size everywhere");
  bind_axis_sizes_list(p, "strides", o.strides, o.spatial_dims,
                       "stride per stage (n_stages entries), each an integer or one per axis in (x, y, z) "
                       "order; [] = 1, 2, 2, ...");
  p.boolean("deep_supervision", o.deep_supervision, "one output per decoder stage");
  p.boolean("conv_bias", o.conv_bias, "conv biases");
  p.number("negative_slope", o.negative_slope, pipeline::Range::non_negative(), "", "LeakyReLU slope");
  bind_norm(p, o.norm, "normalisation: instance (affine, nnU-Net's), batch or none");
}

namespace {
using nlohmann::json;

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

}  // namespace

nlohmann::json nnunet_topology_args(const ConvUNetTopology& o) {
  const std::string d = std::to_string(o.spatial_dims) + "d";
  const bool instance = o.norm == NormKind::instance;
  json norm_kwargs = {{"eps", 1e-5}, {"affine", true}};
  return {{"input_channels", o.in_channels},
          {"n_stages", o.n_stages},
          {"features_per_stage", o.features()},
          {"conv_op", "Conv" + d},
          {"kernel_sizes", nnunet_sizes(o.resolved_kernel_sizes(), o.spatial_dims)},
          {"strides", nnunet_sizes(o.resolved_strides(), o.spatial_dims)},
          {"num_classes", o.num_classes},
          {"n_conv_per_stage_decoder", o.n_conv_per_stage_decoder},
          {"conv_bias", o.conv_bias},
          {"norm_op", (instance ? "InstanceNorm" : "BatchNorm") + d},
          {"norm_op_kwargs", norm_kwargs},
          {"nonlin", "LeakyReLU"},
          {"nonlin_kwargs", {{"negative_slope", o.negative_slope}, {"inplace", true}}},
          {"deep_supervision", o.deep_supervision}};
}

ModelInfo conv_unet_info(const std::string& name, const ConvUNetTopology& o) {
  return ModelInfo{
      name, o.spatial_dims,   o.in_channels, o.num_classes, false, o.deep_supervision, o.size_divisor(),
      0,    o.size_divisors()};
}

Result<ExportedModel> export_nnunet_unet(
    const std::string& net, const std::string& target, const ConvUNetTopology& o,
    const torch::nn::Module& module,
    const std::function<Result<std::vector<std::string>>(const std::string&)>& names,
    const nlohmann::json& extra_args) {
  if (o.norm == NormKind::none)
    return invalid_argument(
        "export --to pytorch: " + net +
        " with norm none has no dynamic_network_architectures layout handled here; expected "
        "norm instance or batch");
  ExportedModel m;
  m.target = target;
  auto add = [&](const std::string& name, const at::Tensor& t) -> Status {
    SEGFLOW_ASSIGN_OR_RETURN(std::vector<std::string> all, names(name));
    for (const auto& n : all) m.state_dict.emplace_back(n, t.detach().to(at::kCPU).contiguous());
    return Status::ok();
  };
  for (const auto& p : module.named_parameters()) SEGFLOW_RETURN_IF_ERROR(add(p.key(), p.value()));
  for (const auto& b : module.named_buffers()) SEGFLOW_RETURN_IF_ERROR(add(b.key(), b.value()));
  json args = nnunet_topology_args(o);
  args.update(extra_args);
  m.spec = {{"target", m.target}, {"args", args}};
  return m;
}

ForeignNames nnunet_foreign_names(std::string what, std::string marker,
                                  std::function<std::string(const std::string&)> rename) {
  ForeignNames f;
  f.scheme = "nnunet";
  f.what = std::move(what);
  f.marker = std::move(marker);
  f.renamer = [rename = std::move(rename)](const std::any&, const std::vector<std::string>&) {
    return rename;
  };
  f.duplicate = [](const std::string& name) {
    return name.find(".all_modules.") != std::string::npos || name.rfind("decoder.encoder.", 0) == 0;
  };
  return f;
}

// ---------------------------------------------------------------------- the network's row

namespace {

void bind_plain_unet(pipeline::OptionParser& p, PlainConvUNetOptions& o) {
  bind_conv_unet_topology(p, o);
  p.integer("n_conv_per_stage", o.n_conv_per_stage, pipeline::Range::at_least(1), "",
            "encoder convs per stage");
  if (p.ok()) p.check(o.validate(), "plain_unet");
}

Result<ModelHandle> build_plain_unet(const PlainConvUNetOptions& o) {
  SEGFLOW_RETURN_IF_ERROR(o.validate());
  auto m = PlainConvUNet(o).ptr();
  return ModelHandle(conv_unet_info("plain_unet", o), m,
                     [](torch::nn::Module& mod, const at::Tensor& x, const at::Tensor&) {
                       return static_cast<PlainConvUNetImpl&>(mod).forward(x);
                     });
}

std::int64_t plain_unet_in_channels(const PlainConvUNetOptions& o) { return o.in_channels; }

Result<ExportedModel> export_plain_unet(const PlainConvUNetOptions& o, const torch::nn::Module& module) {
  return export_nnunet_unet("plain_unet", "dynamic_network_architectures.architectures.unet.PlainConvUNet", o,
                            module, nnunet_plain_names, {{"n_conv_per_stage", o.n_conv_per_stage}});
}

}  // namespace

NetworkRow plain_unet_network() {
  NetworkRow r = network_row<PlainConvUNetOptions>("plain_unet", "nnU-Net's PlainConvUNet", bind_plain_unet,
                                                   build_plain_unet, plain_unet_in_channels);
  r.head_prefixes = {"seg_layers."};
  r.foreign_names = {nnunet_foreign_names("nnU-Net's PlainConvUNet", "encoder.stages.", segflow_name_nnunet)};
  r.pytorch = typed_hook<PlainConvUNetOptions>(export_plain_unet);
  return r;
}

}  // namespace segflow::models
