#include "models/nets/unet.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <numeric>
#include <ostream>
#include <sstream>

namespace segflow::models {
namespace {

std::string join(const std::vector<int64_t>& v) {
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < v.size(); ++i) s << (i ? ", " : "") << v[i];
  s << "]";
  return s.str();
}

// "" when `s` has one value or one per axis, each >= 1 (and odd when `odd`); else the
// message's "expected ..., got ..." part.
std::string axis_sizes_error(const AxisSizes& s, int spatial_dims, bool odd) {
  const size_t n = s.xyz().size();
  bool ok = n == 1 || n == static_cast<size_t>(spatial_dims);
  for (auto v : s.xyz()) ok = ok && v >= 1 && (!odd || v % 2 == 1);
  if (ok) return "";
  if (n == 1)
    return std::string("expected ") + (odd ? "an odd number >= 1" : "a positive integer") + ", got " +
           s.text();
  return "expected " + std::to_string(spatial_dims) + (odd ? " odd numbers >= 1 " : " positive integers ") +
         axis_order_text(spatial_dims) + ", got " + s.text();
}

// The first entry of `list` that axis_sizes_error refuses, as "<field>[i]: expected ..., got ...".
std::string first_axis_sizes_error(const std::string& field, const std::vector<AxisSizes>& list,
                                   int spatial_dims, bool odd) {
  for (size_t i = 0; i < list.size(); ++i) {
    const auto e = axis_sizes_error(list[i], spatial_dims, odd);
    if (!e.empty()) return field + "[" + std::to_string(i) + "]: " + e;
  }
  return "";
}

// Products of strides per axis above this are refused (no input is that large; it keeps the
// products and their least common multiple inside int64).
constexpr int64_t kMaxSizeDivisor = int64_t{1} << 20;

// "" when the product of the strides on every axis is at most kMaxSizeDivisor (entries
// already checked positive), else the message naming the field and the axis.
std::string divisor_error(const char* field, const std::vector<AxisSizes>& strides, int spatial_dims) {
  for (size_t a = 0; a < static_cast<size_t>(spatial_dims); ++a) {
    int64_t p = 1;
    for (const auto& s : strides) {
      if (s.axis(a) > kMaxSizeDivisor / p)
        return std::string(field) + ": expected a product of at most " + std::to_string(kMaxSizeDivisor) +
               " on " + "xyz"[a] + " (every input size on that axis must be a multiple of it), got " +
               to_string(strides);
      p *= s.axis(a);
    }
  }
  return "";
}

// Per axis (x, y[, z]): the product of the entries on that axis.
std::vector<int64_t> axis_products(const std::vector<AxisSizes>& list, int spatial_dims) {
  std::vector<int64_t> p(static_cast<size_t>(spatial_dims), 1);
  for (const auto& s : list)
    for (size_t a = 0; a < p.size(); ++a) p[a] *= s.axis(a);
  return p;
}

int64_t lcm_of(const std::vector<int64_t>& v) {
  int64_t l = 1;
  for (auto x : v) l = std::lcm(l, x);
  return l;
}

// Checks (N, C, *spatial) against the expected dims/channels and the divisor of each axis
// (x, y[, z]; tensors hold them in reverse).
void check_input(const char* who, const at::Tensor& x, int spatial_dims, int64_t channels,
                 const std::vector<int64_t>& divisors) {
  TORCH_CHECK(x.dim() == spatial_dims + 2, who, ": expected a ", spatial_dims + 2,
              "-d input (N, C, *spatial), got shape ", x.sizes());
  TORCH_CHECK(x.size(1) == channels, who, ": expected ", channels, " input channels, got shape ", x.sizes());
  for (int a = 0; a < spatial_dims; ++a) {
    const int64_t size = x.size(x.dim() - 1 - a), divisor = divisors[static_cast<size_t>(a)];
    TORCH_CHECK(size % divisor == 0, who, ": the spatial size on ", "xyz"[a], " (", size,
                ") must be divisible by ", divisor, " (the product of the strides on that axis; per axis ",
                axis_order_text(spatial_dims), ": ", join(divisors), "), got shape ", x.sizes());
  }
}

}  // namespace

// ------------------------------------------------------------------------------- AxisSizes

const char* axis_order_text(int spatial_dims) { return spatial_dims == 3 ? "(x, y, z)" : "(x, y)"; }

DimSizes AxisSizes::dims() const { return DimSizes(std::vector<int64_t>(xyz_.rbegin(), xyz_.rend())); }

bool AxisSizes::all_equal(int64_t v) const {
  for (auto x : xyz_)
    if (x != v) return false;
  return true;
}

std::string AxisSizes::text() const { return xyz_.size() == 1 ? std::to_string(xyz_.front()) : join(xyz_); }

bool operator==(const AxisSizes& a, const AxisSizes& b) {
  if (a.xyz_.size() == 1) return b.all_equal(a.xyz_.front());
  if (b.xyz_.size() == 1) return a.all_equal(b.xyz_.front());
  return a.xyz_ == b.xyz_;
}

void to_json(nlohmann::json& j, const AxisSizes& sizes) {
  if (sizes.xyz().size() == 1)
    j = sizes.xyz().front();
  else
    j = sizes.xyz();
}

std::ostream& operator<<(std::ostream& stream, const AxisSizes& sizes) { return stream << sizes.text(); }

std::string to_string(const std::vector<AxisSizes>& sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + sizes[i].text();
  return s + "]";
}

// ------------------------------------------------------------------------------ UNetOptions

Status UNetOptions::validate() const {
  if (spatial_dims != 2 && spatial_dims != 3)
    return invalid_argument("unet: spatial_dims: expected 2 or 3, got " + std::to_string(spatial_dims));
  if (in_channels < 1)
    return invalid_argument("unet: in_channels: expected >= 1, got " + std::to_string(in_channels));
  if (out_channels < 1)
    return invalid_argument("unet: out_channels: expected >= 1, got " + std::to_string(out_channels));
  if (channels.size() < 2)
    return invalid_argument("unet: channels: expected at least 2 entries, got " + join(channels));
  for (auto c : channels)
    if (c < 1) return invalid_argument("unet: channels: expected positive numbers, got " + join(channels));
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
  check_input("UNet", x, options.spatial_dims, options.in_channels, options.size_divisors());
  std::vector<at::Tensor> skips;
  at::Tensor h = x;
  for (size_t i = 0; i < down->size(); ++i) {
    h = down->at<ResidualUnitImpl>(i).forward(h);
    skips.push_back(h);
  }
  h = bottom->forward(h);
  for (size_t i = up->size(); i-- > 0;) {
    h = up->at<UpLayerImpl>(i).forward(at::cat({skips[i], h}, 1));
  }
  return h;
}

void UNetImpl::pretty_print(std::ostream& s) const {
  const auto& o = options;
  s << "segflow::models::UNet(spatial_dims=" << o.spatial_dims << ", in_channels=" << o.in_channels
    << ", out_channels=" << o.out_channels << ", channels=" << join(o.channels)
    << ", strides=" << to_string(o.strides) << ", kernel_size=" << o.kernel_size.text()
    << ", up_kernel_size=" << o.up_kernel_size.text() << ", num_res_units=" << o.num_res_units
    << ", norm=" << to_string(o.norm) << ", act=" << to_string(o.act) << ", dropout=" << o.dropout << ")";
}

// --------------------------------------------------------------------- PlainConvUNetOptions

Status PlainConvUNetOptions::validate() const {
  auto bad = [](const std::string& field, const std::string& expected, const std::string& got) {
    return invalid_argument("plain_unet: " + field + ": expected " + expected + ", got " + got);
  };
  if (spatial_dims != 2 && spatial_dims != 3)
    return bad("spatial_dims", "2 or 3", std::to_string(spatial_dims));
  if (in_channels < 1) return bad("in_channels", ">= 1", std::to_string(in_channels));
  if (num_classes < 1) return bad("num_classes", ">= 1", std::to_string(num_classes));
  if (n_stages < 2) return bad("n_stages", ">= 2", std::to_string(n_stages));
  if (base_features < 1) return bad("base_features", ">= 1", std::to_string(base_features));
  if (max_features < base_features)
    return bad("max_features", ">= base_features", std::to_string(max_features));
  if (n_conv_per_stage < 1) return bad("n_conv_per_stage", ">= 1", std::to_string(n_conv_per_stage));
  if (n_conv_per_stage_decoder < 1)
    return bad("n_conv_per_stage_decoder", ">= 1", std::to_string(n_conv_per_stage_decoder));
  if (kernel_size < 1 || kernel_size % 2 == 0)
    return bad("kernel_size", "an odd number >= 1", std::to_string(kernel_size));
  if (!kernel_sizes.empty() && static_cast<int64_t>(kernel_sizes.size()) != n_stages)
    return bad("kernel_sizes", std::to_string(n_stages) + " entries (one per stage)",
               to_string(kernel_sizes));
  if (auto e = first_axis_sizes_error("kernel_sizes", kernel_sizes, spatial_dims, true); !e.empty())
    return invalid_argument("plain_unet: " + e);
  if (!strides.empty() && static_cast<int64_t>(strides.size()) != n_stages)
    return bad("strides", std::to_string(n_stages) + " entries (one per stage)", to_string(strides));
  if (auto e = first_axis_sizes_error("strides", strides, spatial_dims, false); !e.empty())
    return invalid_argument("plain_unet: " + e);
  if (auto e = divisor_error("strides", strides, spatial_dims); !e.empty())
    return invalid_argument("plain_unet: " + e);
  if (strides.empty() && n_stages > 21)  // the default 1, 2, 2, ...: a divisor of 2^(n_stages - 1)
    return bad("n_stages",
               "at most 21 with the default strides (inputs must be multiples of 2^(n_stages - 1))",
               std::to_string(n_stages));
  if (!(negative_slope >= 0.0)) return bad("negative_slope", ">= 0", std::to_string(negative_slope));
  return Status::ok();
}

std::vector<int64_t> PlainConvUNetOptions::features() const {
  std::vector<int64_t> f;
  int64_t c = base_features;
  for (int64_t s = 0; s < n_stages; ++s) {
    f.push_back(std::min(c, max_features));
    c = std::min(c * 2, max_features);
  }
  return f;
}

std::vector<AxisSizes> PlainConvUNetOptions::resolved_strides() const {
  if (!strides.empty()) return strides;
  std::vector<AxisSizes> s(static_cast<size_t>(std::max<int64_t>(n_stages, 1)), 2);
  s[0] = 1;
  return s;
}

std::vector<AxisSizes> PlainConvUNetOptions::resolved_kernel_sizes() const {
  if (!kernel_sizes.empty()) return kernel_sizes;
  return std::vector<AxisSizes>(static_cast<size_t>(std::max<int64_t>(n_stages, 0)), kernel_size);
}

std::vector<int64_t> PlainConvUNetOptions::size_divisors() const {
  return axis_products(resolved_strides(), spatial_dims);
}

int64_t PlainConvUNetOptions::size_divisor() const { return lcm_of(size_divisors()); }

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
  check_input("PlainConvUNet", x, options.spatial_dims, options.in_channels, options.size_divisors());
  auto run = [](torch::nn::ModuleListImpl& l, at::Tensor h) {
    for (size_t i = 0; i < l.size(); ++i) h = l.at<ConvBlockImpl>(i).forward(h);
    return h;
  };
  std::vector<at::Tensor> skips;
  at::Tensor h = x;
  for (size_t s = 0; s < encoder_stages->size(); ++s) {
    h = run(encoder_stages->at<torch::nn::ModuleListImpl>(s), h);
    skips.push_back(h);
  }
  std::vector<at::Tensor> outs;
  const size_t nd = decoder_stages->size();
  for (size_t d = 0; d < nd; ++d) {
    h = transpconvs->at<ConvNdImpl>(d).forward(h);
    h = at::cat({h, skips[nd - 1 - d]}, 1);
    h = run(decoder_stages->at<torch::nn::ModuleListImpl>(d), h);
    if (options.deep_supervision || d == nd - 1) outs.push_back(seg_layers->at<ConvNdImpl>(d).forward(h));
  }
  std::reverse(outs.begin(), outs.end());
  return outs;
}

void PlainConvUNetImpl::pretty_print(std::ostream& s) const {
  const auto& o = options;
  s << "segflow::models::PlainConvUNet(spatial_dims=" << o.spatial_dims << ", in_channels=" << o.in_channels
    << ", num_classes=" << o.num_classes << ", features=" << join(o.features())
    << ", strides=" << to_string(o.resolved_strides())
    << ", kernel_sizes=" << to_string(o.resolved_kernel_sizes())
    << ", n_conv_per_stage=" << o.n_conv_per_stage
    << ", deep_supervision=" << (o.deep_supervision ? "true" : "false") << ")";
}

}  // namespace segflow::models
