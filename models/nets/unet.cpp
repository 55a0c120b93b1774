#include "models/nets/unet.hpp"

#include <torch/nn/module.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <ostream>
#include <sstream>

#include "models/nets/monai_names.hpp"
#include "models/nets/recompute.hpp"
#include "pipeline/options.hpp"

namespace segflow::models {

// ------------------------------------------------------------------------------ UNetOptions

Status UNetOptions::validate() const {
  if (spatial_dims != 2 && spatial_dims != 3)
    return invalid_argument("unet: spatial_dims: expected 2 or 3, got " + std::to_string(spatial_dims));
  if (in_channels < 1)
    return invalid_argument("unet: in_channels: expected >= 1, got " + std::to_string(in_channels));
  if (out_channels < 1)
    return invalid_argument("unet: out_channels: expected >= 1, got " + std::to_string(out_channels));
  if (channels.size() < 2)
    return invalid_argument("unet: channels: expected at least 2 entries, got " + sizes_text(channels));
  for (auto c : channels)
    if (c < 1)
      return invalid_argument("unet: channels: expected positive numbers, got " + sizes_text(channels));
  if (strides.size() != channels.size() - 1)
    return invalid_argument("unet: strides: expected " + std::to_string(channels.size() - 1) +
                            " entries (len(channels) - 1), got " + to_string(strides));
  if (auto e = first_axis_sizes_error("strides", strides, spatial_dims, false); !e.empty())
    return invalid_argument("unet: " + e);
  if (auto e = divisor_error("strides", strides, spatial_dims); !e.empty())
    return invalid_argument("unet: " + e);
  if (auto e = axis_sizes_error(kernel_size, spatial_dims, true); !e.empty())
    return invalid_argument("unet: kernel_size: " + e);
  if (auto e = axis_sizes_error(up_kernel_size, spatial_dims, true); !e.empty())
    return invalid_argument("unet: up_kernel_size: " + e);
  if (num_res_units < 0)
    return invalid_argument("unet: num_res_units: expected >= 0, got " + std::to_string(num_res_units));
  if (!(dropout >= 0.0 && dropout < 1.0))
    return invalid_argument("unet: dropout: expected a probability in [0, 1), got " +
                            std::to_string(dropout));
  if (act == ActKind::gelu) return invalid_argument("unet: act: expected relu, prelu or leakyrelu, got gelu");
  return Status::ok();
}

std::vector<int64_t> UNetOptions::size_divisors() const { return axis_products(strides, spatial_dims); }

int64_t UNetOptions::size_divisor() const { return lcm_of(size_divisors()); }

// ---------------------------------------------------------------------------- ResidualUnit

ResidualUnitImpl::ResidualUnitImpl(ResidualUnitOptions o) : options(std::move(o)) { reset(); }

void ResidualUnitImpl::reset() {
  const auto& o = options;
  TORCH_CHECK(o.subunits >= 1, "ResidualUnit: subunits must be >= 1");
  conv = register_module("conv", torch::nn::ModuleList());
  ConvBlockOptions b = o.block;
  for (int64_t su = 0; su < o.subunits; ++su) {
    b.conv_only = o.block.conv_only || (o.last_conv_only && su == o.subunits - 1);
    conv->push_back(ConvBlock(b));
    b.conv.in_channels = b.conv.out_channels;
    b.conv.stride = 1;
  }
  residual = nullptr;
  const auto& c = o.block.conv;
  // MONAI: a residual conv when np.prod(strides) != 1 or the channels change.
  const bool strided = !c.stride.all_equal(1);
  if (o.residual && (strided || c.in_channels != c.out_channels)) {
    ConvOptions r = c;
    r.transposed = false;
    r.output_padding = 0;
    if (!strided) {  // only the channel count changes: 1x1 conv
      r.kernel_size = 1;
      r.padding = 0;
    }
    residual = register_module("residual", ConvNd(r));
  }
}

at::Tensor ResidualUnitImpl::forward(const at::Tensor& x) {
  at::Tensor y = x;
  for (size_t i = 0; i < conv->size(); ++i) y = conv->at<ConvBlockImpl>(i).forward(y);
  if (!options.residual) return y;
  return y + (residual ? residual->forward(x) : x);
}

void ResidualUnitImpl::pretty_print(std::ostream& s) const {
  s << "segflow::models::ResidualUnit(subunits=" << options.subunits
    << (options.residual ? "" : ", residual=false") << ")";
}

// --------------------------------------------------------------------------------- UpLayer

UpLayerImpl::UpLayerImpl(ConvBlockOptions t, bool r, ResidualUnitOptions ro)
    : up_options(std::move(t)), with_residual(r), residual_options(std::move(ro)) {
  reset();
}

void UpLayerImpl::reset() {
  conv = register_module("conv", ConvBlock(up_options));
  ru = with_residual ? register_module("ru", ResidualUnit(residual_options)) : nullptr;
}

at::Tensor UpLayerImpl::forward(const at::Tensor& x) {
  auto y = conv->forward(x);
  return ru ? ru->forward(y) : y;
}

// ------------------------------------------------------------------------------------ UNet

UNetImpl::UNetImpl(UNetOptions o) : options(std::move(o)) { reset(); }

void UNetImpl::reset() {
  const auto& o = options;
  auto st = o.validate();
  TORCH_CHECK(st.is_ok(), st.message());
  const auto n = o.channels.size();
  const DimSizes kernel = o.kernel_size.dims(), up_kernel = o.up_kernel_size.dims();
  auto unit = [&](int64_t inc, int64_t outc, const DimSizes& stride) {
    ResidualUnitOptions r;
    r.block.conv = ConvOptions{o.spatial_dims, inc, outc, kernel, stride, -1, 0, false, o.bias};
    r.block.norm = o.norm;
    r.block.act = ActOptions{o.act};
    r.block.dropout = o.dropout;
    r.subunits = std::max<int64_t>(1, o.num_res_units);
    r.residual = o.num_res_units > 0;
    return ResidualUnit(r);
  };
  down = register_module("down", torch::nn::ModuleList());
  for (size_t i = 0; i + 1 < n; ++i) {
    down->push_back(unit(i == 0 ? o.in_channels : o.channels[i - 1], o.channels[i], o.strides[i].dims()));
  }
  bottom = register_module("bottom", unit(o.channels[n - 2], o.channels[n - 1], 1));
  up = register_module("up", torch::nn::ModuleList());
  for (size_t i = 0; i + 1 < n; ++i) {
    const bool top = i == 0;
    const int64_t upc = (i == n - 2) ? o.channels[i] + o.channels[n - 1] : 2 * o.channels[i];
    const int64_t outc = top ? o.out_channels : o.channels[i - 1];
    // MONAI's transposed Convolution: "same" padding, output_padding = stride - 1 per axis.
    const DimSizes stride = o.strides[i].dims();
    std::vector<int64_t> out_pad;
    for (auto v : stride.expand(o.spatial_dims)) out_pad.push_back(v - 1);
    ConvBlockOptions t;
    t.conv = ConvOptions{o.spatial_dims,      upc,   outc, up_kernel, stride, -1, DimSizes(out_pad),
                         /*transposed=*/true, o.bias};
    t.norm = o.norm;
    t.act = ActOptions{o.act};
    t.dropout = o.dropout;
    t.conv_only = top && o.num_res_units == 0;
    ResidualUnitOptions r;
    r.block = t;
    r.block.conv = ConvOptions{o.spatial_dims, outc, outc, kernel, 1, -1, 0, false, o.bias};
    r.block.conv_only = false;
    r.subunits = 1;
    r.residual = true;
    r.last_conv_only = top;
    up->push_back(UpLayer(t, o.num_res_units > 0, r));
  }
}

at::Tensor UNetImpl::forward(const at::Tensor& x) {
  check_network_input("UNet", x, options.spatial_dims, options.in_channels, options.size_divisors());
  std::vector<at::Tensor> skips;
  at::Tensor h = x;
  // Each stage through recompute_stage: with train.activation_checkpointing only the stage
  // inputs are kept for backward (models/nets/recompute.hpp).
  for (size_t i = 0; i < down->size(); ++i) {
    auto& unit = down->at<ResidualUnitImpl>(i);
    h = recompute_stage(
        unit, [&unit](const at::Tensor& t) { return unit.forward(t); }, h);
    skips.push_back(h);
  }
  h = recompute_stage(
      *bottom, [this](const at::Tensor& t) { return bottom->forward(t); }, h);
  for (size_t i = up->size(); i-- > 0;) {
    auto& layer = up->at<UpLayerImpl>(i);
    h = recompute_stage(
        layer, [&layer](const at::Tensor& t) { return layer.forward(t); }, at::cat({skips[i], h}, 1));
  }
  return h;
}

void UNetImpl::pretty_print(std::ostream& s) const {
  const auto& o = options;
  s << "segflow::models::UNet(spatial_dims=" << o.spatial_dims << ", in_channels=" << o.in_channels
    << ", out_channels=" << o.out_channels << ", channels=" << sizes_text(o.channels)
    << ", strides=" << to_string(o.strides) << ", kernel_size=" << o.kernel_size.text()
    << ", up_kernel_size=" << o.up_kernel_size.text() << ", num_res_units=" << o.num_res_units
    << ", norm=" << to_string(o.norm) << ", act=" << to_string(o.act) << ", dropout=" << o.dropout << ")";
}

// ---------------------------------------------------------------------- the network's row

namespace {

void bind_unet(pipeline::OptionParser& p, UNetOptions& o) {
  p.integer("spatial_dims", o.spatial_dims, pipeline::Range::closed(2, 3), "",
            "2D (Y, X) or 3D (Z, Y, X) inputs");
  p.integer("in_channels", o.in_channels, pipeline::Range::at_least(1), "channels", "input image channels");
  p.integer("out_channels", o.out_channels, pipeline::Range::at_least(1), "channels",
            "output logit channels (classes incl. background)");
  p.integer_list("channels", o.channels, pipeline::Range::at_least(1), false,
                 "features per level, >= 2 levels");
  bind_axis_sizes_list(p, "strides", o.strides, o.spatial_dims,
                       "downsampling between levels (len(channels) - 1 entries), each an integer or one per "
                       "axis in (x, y, z) order");
  bind_axis_sizes(p, "kernel_size", o.kernel_size, o.spatial_dims,
                  "conv kernel size in voxels (odd): an integer or one per axis (x, y, z)");
  bind_axis_sizes(p, "up_kernel_size", o.up_kernel_size, o.spatial_dims,
                  "transposed-conv kernel size in voxels (odd): an integer or one per axis (x, y, z)");
  p.integer("num_res_units", o.num_res_units, pipeline::Range::non_negative(), "",
            "residual units per block; 0 = plain conv blocks");
  bind_norm(p, o.norm, "normalisation: batch, instance (affine) or none");
  std::string act = to_string(o.act);
  p.choice("act", act, {"relu", "prelu", "leakyrelu", "none"}, "activation");
  if (auto a = parse_act(act); a.is_ok()) o.act = *a;
  p.number("dropout", o.dropout, pipeline::Range{0.0, 1.0, false, true}, "", "dropout probability");
  p.boolean("bias", o.bias, "conv biases");
  if (p.ok()) p.check(o.validate(), "unet");
}

Result<ModelHandle> build_unet(const UNetOptions& o) {
  SEGFLOW_RETURN_IF_ERROR(o.validate());  // before size_divisors() reads the strides
  ModelInfo info{"unet", o.spatial_dims,   o.in_channels, o.out_channels, false, false, o.size_divisor(),
                 0,      o.size_divisors()};
  auto m = UNet(o).ptr();
  return ModelHandle(info, m, [](torch::nn::Module& mod, const at::Tensor& x, const at::Tensor&) {
    return std::vector<at::Tensor>{static_cast<UNetImpl&>(mod).forward(x)};
  });
}

std::int64_t unet_in_channels(const UNetOptions& o) { return o.in_channels; }

using nlohmann::json;

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

}  // namespace

NetworkRow unet_network() {
  NetworkRow r = network_row<UNetOptions>("unet", "MONAI's UNet", bind_unet, build_unet, unet_in_channels);
  r.head_prefixes = {"up.0."};
  ForeignNames monai;
  monai.scheme = "monai";
  monai.what = "MONAI's UNet";
  monai.marker = "model.";
  monai.renamer = [](const std::any& net, const std::vector<std::string>& model_names) {
    const auto& o = std::any_cast<const UNetOptions&>(net);
    auto from_monai = std::make_shared<std::map<std::string, std::string>>(
        segflow_names_from_monai(model_names, o.channels.size() - 1, o.num_res_units));
    return std::function<std::string(const std::string&)>([from_monai](const std::string& n) {
      auto it = from_monai->find(n);
      return it == from_monai->end() ? std::string() : it->second;
    });
  };
  r.foreign_names = {monai};
  r.pytorch = typed_hook<UNetOptions>(export_unet);
  return r;
}

}  // namespace segflow::models
