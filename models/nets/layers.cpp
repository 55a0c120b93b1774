#include "models/nets/layers.hpp"

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <cmath>
#include <ostream>

#include "pipeline/options.hpp"

namespace segflow::models {

Result<NormKind> parse_norm(const std::string& s) {
  if (s == "batch") return NormKind::batch;
  if (s == "instance") return NormKind::instance;
  if (s == "none") return NormKind::none;
  return invalid_argument("norm: expected one of batch, instance, none, got '" + s + "'");
}

Result<ActKind> parse_act(const std::string& s) {
  if (s == "relu") return ActKind::relu;
  if (s == "prelu") return ActKind::prelu;
  if (s == "leakyrelu") return ActKind::leakyrelu;
  if (s == "gelu") return ActKind::gelu;
  if (s == "none") return ActKind::none;
  return invalid_argument("act: expected one of relu, prelu, leakyrelu, gelu, none, got '" + s + "'");
}

const char* to_string(NormKind k) noexcept {
  switch (k) {
    case NormKind::none:
      return "none";
    case NormKind::batch:
      return "batch";
    case NormKind::instance:
      return "instance";
  }
  return "?";
}

const char* to_string(ActKind k) noexcept {
  switch (k) {
    case ActKind::none:
      return "none";
    case ActKind::relu:
      return "relu";
    case ActKind::prelu:
      return "prelu";
    case ActKind::leakyrelu:
      return "leakyrelu";
    case ActKind::gelu:
      return "gelu";
  }
  return "?";
}

// -------------------------------------------------------------------------------- DimSizes

std::vector<int64_t> DimSizes::expand(int dims) const {
  std::vector<int64_t> out;
  for (int d = 0; d < dims; ++d) out.push_back((*this)[static_cast<size_t>(d)]);
  return out;
}

bool DimSizes::all_equal(int64_t v) const {
  for (auto x : values_)
    if (x != v) return false;
  return true;
}

std::string DimSizes::text() const {
  if (!values_.empty() && all_equal(values_.front())) return std::to_string(values_.front());
  std::string s = "[";
  for (size_t i = 0; i < values_.size(); ++i) s += (i ? ", " : "") + std::to_string(values_[i]);
  return s + "]";
}

std::ostream& operator<<(std::ostream& stream, const DimSizes& sizes) { return stream << sizes.text(); }

bool operator==(const DimSizes& a, const DimSizes& b) {
  if (a.values_.size() == 1) return b.all_equal(a.values_.front());
  if (b.values_.size() == 1) return a.all_equal(b.values_.front());
  return a.values_ == b.values_;
}

// ---------------------------------------------------------------------------------- ConvNd

namespace {

// Checks that `s` has one value or one per dim, each >= `min`.
void check_dim_sizes(const char* what, const DimSizes& s, int dims, int64_t min) {
  const auto n = s.values().size();
  TORCH_CHECK(n == 1 || n == static_cast<size_t>(dims), "ConvNd: ", what, ": expected 1 or ", dims,
              " values, got ", s.text());
  for (auto v : s.values())
    TORCH_CHECK(v >= min, "ConvNd: ", what, ": expected values >= ", min, ", got ", s.text());
}

}  // namespace

ConvNdImpl::ConvNdImpl(ConvOptions o) : options(std::move(o)) { reset(); }

void ConvNdImpl::reset() {
  const auto& o = options;
  TORCH_CHECK(o.spatial_dims == 2 || o.spatial_dims == 3, "ConvNd: spatial_dims must be 2 or 3, got ",
              o.spatial_dims);
  TORCH_CHECK(o.in_channels > 0 && o.out_channels > 0, "ConvNd: channels must be positive");
  check_dim_sizes("kernel_size", o.kernel_size, o.spatial_dims, 1);
  check_dim_sizes("stride", o.stride, o.spatial_dims, 1);
  check_dim_sizes("padding", o.padding, o.spatial_dims, -1);
  check_dim_sizes("output_padding", o.output_padding, o.spatial_dims, 0);
  std::vector<int64_t> shape = o.transposed ? std::vector<int64_t>{o.in_channels, o.out_channels}
                                            : std::vector<int64_t>{o.out_channels, o.in_channels};
  for (auto k : o.kernel_size.expand(o.spatial_dims)) shape.push_back(k);
  weight = register_parameter("weight", torch::empty(shape));
  if (o.bias) {
    bias = register_parameter("bias", torch::empty({o.out_channels}));
  } else {
    bias = at::Tensor();
  }
  reset_parameters();
}

void ConvNdImpl::reset_parameters() {
  torch::NoGradGuard no_grad;
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    auto [fan_in, fan_out] = torch::nn::init::_calculate_fan_in_and_fan_out(weight);
    (void)fan_out;
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    torch::nn::init::uniform_(bias, -bound, bound);
  }
}

std::vector<int64_t> ConvNdImpl::resolved_padding() const {
  const auto& o = options;
  std::vector<int64_t> pad;
  for (int d = 0; d < o.spatial_dims; ++d) {
    const auto p = o.padding[static_cast<size_t>(d)];
    pad.push_back(p < 0 ? (o.kernel_size[static_cast<size_t>(d)] - 1) / 2 : p);
  }
  return pad;
}

at::Tensor ConvNdImpl::forward(const at::Tensor& x) {
  const auto& o = options;
  TORCH_CHECK(x.dim() == o.spatial_dims + 2, "ConvNd: expected a ", o.spatial_dims + 2,
              "-d input (N, C, *spatial), got shape ", x.sizes());
  const std::vector<int64_t> stride = o.stride.expand(o.spatial_dims), padding = resolved_padding(),
                             dilation(o.spatial_dims, 1),
                             out_pad = o.transposed ? o.output_padding.expand(o.spatial_dims)
                                                    : std::vector<int64_t>(o.spatial_dims, 0);
  // The named ops, not at::convolution: autocast lists conv2d/conv3d/conv_transpose2d/3d on
  // CPU and CUDA, but not convolution on CPU, so after an op autocast did cast (PReLU, say)
  // at::convolution would meet a bf16 input with float32 weights.
  if (o.transposed)
    return o.spatial_dims == 3 ? at::conv_transpose3d(x, weight, bias, stride, padding, out_pad, 1, dilation)
                               : at::conv_transpose2d(x, weight, bias, stride, padding, out_pad, 1, dilation);
  // LibTorch 2.11's CPU bfloat16 conv3d returns garbage weight gradients (1e30, inf, NaN, at
  // random) when the input's depth is at least 2 and less than the kernel size, as at the
  // bottom of a UNet on small crops (tests/models/test_amp.cpp has the case). Such layers are
  // tiny: under CPU autocast they run in float32.
  if (o.spatial_dims == 3 && x.is_cpu() && x.size(2) >= 2 && x.size(2) < o.kernel_size[0] &&
      at::autocast::is_autocast_enabled(c10::DeviceType::CPU)) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
    return at::conv3d(x.to(weight.scalar_type()), weight, bias, stride, padding, dilation, 1);
  }
  return o.spatial_dims == 3 ? at::conv3d(x, weight, bias, stride, padding, dilation, 1)
                             : at::conv2d(x, weight, bias, stride, padding, dilation, 1);
}

void ConvNdImpl::pretty_print(std::ostream& s) const {
  const auto& o = options;
  s << "segflow::models::ConvNd(" << o.spatial_dims << "d" << (o.transposed ? ", transposed" : "") << ", "
    << o.in_channels << ", " << o.out_channels << ", kernel_size=" << o.kernel_size.text()
    << ", stride=" << o.stride.text() << ", padding=" << DimSizes(resolved_padding()).text();
  if (o.transposed && !o.output_padding.all_equal(0)) s << ", output_padding=" << o.output_padding.text();
  if (!o.bias) s << ", bias=false";
  s << ")";
}

// ------------------------------------------------------------------------------------ Norm

NormImpl::NormImpl(NormOptions o) : options(o) { reset(); }

void NormImpl::reset() {
  const auto& o = options;
  TORCH_CHECK(o.kind != NormKind::none, "Norm: kind none has no module");
  if (o.affine) {
    weight = register_parameter("weight", torch::ones({o.channels}));
    bias = register_parameter("bias", torch::zeros({o.channels}));
  }
  if (o.kind == NormKind::batch) {
    running_mean = register_buffer("running_mean", torch::zeros({o.channels}));
    running_var = register_buffer("running_var", torch::ones({o.channels}));
    num_batches_tracked = register_buffer("num_batches_tracked", torch::zeros({}, torch::kLong));
  }
}

at::Tensor NormImpl::forward(const at::Tensor& x) {
  const auto& o = options;
  TORCH_CHECK(x.dim() >= 3 && x.size(1) == o.channels, "Norm: expected (N, ", o.channels,
              ", *spatial), got shape ", x.sizes());
  if (o.kind == NormKind::batch) {
    if (is_training()) {
      torch::NoGradGuard no_grad;
      num_batches_tracked.add_(1);
    }
    return at::batch_norm(x, weight, bias, running_mean, running_var, is_training(), o.momentum, o.eps,
                          /*cudnn_enabled=*/true);
  }
  return at::instance_norm(x, weight, bias, {}, {}, /*use_input_stats=*/true, o.momentum, o.eps,
                           /*cudnn_enabled=*/true);
}

void NormImpl::pretty_print(std::ostream& s) const {
  s << "segflow::models::Norm(" << to_string(options.kind) << ", " << options.channels
    << ", eps=" << options.eps << (options.affine ? "" : ", affine=false") << ")";
}

// ------------------------------------------------------------------------------ Activation

ActivationImpl::ActivationImpl(ActOptions o) : options(o) { reset(); }

void ActivationImpl::reset() {
  if (options.kind == ActKind::prelu) {
    weight = register_parameter("weight", torch::full({1}, options.prelu_init));
  }
}

at::Tensor ActivationImpl::forward(const at::Tensor& x) {
  switch (options.kind) {
    case ActKind::none:
      return x;
    case ActKind::relu:
      return at::relu(x);
    case ActKind::prelu:
      return at::prelu(x, weight);
    case ActKind::leakyrelu:
      return at::leaky_relu(x, options.negative_slope);
    case ActKind::gelu:
      return at::gelu(x);
  }
  return x;
}

void ActivationImpl::pretty_print(std::ostream& s) const {
  s << "segflow::models::Activation(" << to_string(options.kind);
  if (options.kind == ActKind::leakyrelu) s << ", negative_slope=" << options.negative_slope;
  s << ")";
}

// ------------------------------------------------------------------------------- ConvBlock

ConvBlockImpl::ConvBlockImpl(ConvBlockOptions o) : options(std::move(o)) { reset(); }

void ConvBlockImpl::reset() {
  const auto& o = options;
  TORCH_CHECK(o.dropout >= 0.0 && o.dropout < 1.0, "ConvBlock: dropout must be in [0, 1), got ", o.dropout);
  conv = register_module("conv", ConvNd(o.conv));
  norm = nullptr;
  act = nullptr;
  if (o.conv_only) return;
  if (o.norm != NormKind::none) {
    norm = register_module("norm", Norm(NormOptions{o.norm, o.conv.out_channels}));
  }
  if (o.act.kind != ActKind::none) act = register_module("act", Activation(o.act));
}

at::Tensor ConvBlockImpl::forward(const at::Tensor& x) {
  auto y = conv->forward(x);
  if (options.conv_only) return y;
  if (norm) y = norm->forward(y);
  if (options.dropout > 0.0) y = at::dropout(y, options.dropout, is_training());
  if (act) y = act->forward(y);
  return y;
}

void ConvBlockImpl::pretty_print(std::ostream& s) const {
  s << "segflow::models::ConvBlock(" << (options.conv_only ? "conv_only" : to_string(options.norm));
  if (!options.conv_only) s << ", " << to_string(options.act.kind);
  if (options.dropout > 0) s << ", dropout=" << options.dropout;
  s << ")";
}

// ----------------------------------------------------------------------------- LayerNorm2d

LayerNorm2dImpl::LayerNorm2dImpl(int64_t c, double e) : channels(c), eps(e) { reset(); }

void LayerNorm2dImpl::reset() {
  weight = register_parameter("weight", torch::ones({channels}));
  bias = register_parameter("bias", torch::zeros({channels}));
}

at::Tensor LayerNorm2dImpl::forward(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 4 && x.size(1) == channels, "LayerNorm2d: expected (N, ", channels,
              ", H, W), got shape ", x.sizes());
  auto u = x.mean(1, /*keepdim=*/true);
  auto s = (x - u).pow(2).mean(1, /*keepdim=*/true);
  auto y = (x - u) / torch::sqrt(s + eps);
  return weight.view({1, -1, 1, 1}) * y + bias.view({1, -1, 1, 1});
}

void LayerNorm2dImpl::pretty_print(std::ostream& s) const {
  s << "segflow::models::LayerNorm2d(" << channels << ", eps=" << eps << ")";
}

// --------------------------------------------------------------------------------- helpers

void mirror_requires_grad(const torch::nn::Module& source, torch::nn::Module& copy) {
  auto src = source.named_parameters(/*recurse=*/true);
  for (auto& p : copy.named_parameters(/*recurse=*/true)) {
    if (const auto* s = src.find(p.key())) p.value().set_requires_grad(s->requires_grad());
  }
}

void set_requires_grad(torch::nn::Module& module, bool requires_grad) {
  for (auto& p : module.parameters(/*recurse=*/true)) p.set_requires_grad(requires_grad);
}

void bind_norm(pipeline::OptionParser& p, NormKind& norm, const char* doc) {
  std::string s = to_string(norm);
  p.choice("norm", s, {"batch", "instance", "none"}, doc);
  if (auto n = parse_norm(s); n.is_ok()) norm = *n;
}

}  // namespace segflow::models
