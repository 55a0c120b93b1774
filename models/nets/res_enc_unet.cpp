#include "models/nets/res_enc_unet.hpp"

#include <ATen/ATen.h>
#include <torch/nn/init.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <ostream>
#include <regex>

#include "models/nets/recompute.hpp"
#include "pipeline/options.hpp"

namespace segflow::models {

namespace {

/// nnU-Net's conv block (ConvDropoutNormReLU without dropout): "same" padding.
ConvBlockOptions conv_block(const ConvUNetTopology& o, int64_t in, int64_t out, const DimSizes& kernel,
                            const DimSizes& stride, bool act, bool bias) {
  ConvBlockOptions b;
  b.conv = ConvOptions{o.spatial_dims, in, out, kernel, stride, -1, 0, false, bias};
  b.norm = o.norm;
  b.act = act ? ActOptions{ActKind::leakyrelu, o.negative_slope} : ActOptions{ActKind::none};
  return b;
}

}  // namespace

// ----------------------------------------------------------------------- ResEncUNetOptions

std::vector<int64_t> nnunet_resenc_blocks(int64_t n_stages) {
  static constexpr int64_t kFirst[] = {1, 3, 4};
  std::vector<int64_t> out;
  for (int64_t s = 0; s < n_stages; ++s) out.push_back(s < 3 ? kFirst[s] : 6);
  return out;
}

Status ResEncUNetOptions::validate() const {
  if (!n_blocks_per_stage.empty()) {
    if (static_cast<int64_t>(n_blocks_per_stage.size()) != n_stages)
      return invalid_argument("res_enc_unet: n_blocks_per_stage: expected " + std::to_string(n_stages) +
                              " entries (one per stage), got " + sizes_text(n_blocks_per_stage));
    for (auto b : n_blocks_per_stage)
      if (b < 1)
        return invalid_argument("res_enc_unet: n_blocks_per_stage: expected integers >= 1, got " +
                                sizes_text(n_blocks_per_stage));
  }
  return validate_topology("res_enc_unet");
}

std::vector<int64_t> ResEncUNetOptions::resolved_blocks() const {
  return n_blocks_per_stage.empty() ? nnunet_resenc_blocks(n_stages) : n_blocks_per_stage;
}

// ------------------------------------------------------------------------------- ConvStack

ConvStackImpl::ConvStackImpl(std::vector<ConvBlockOptions> b) : blocks(std::move(b)) { reset(); }

void ConvStackImpl::reset() {
  convs = register_module("convs", torch::nn::ModuleList());
  for (const auto& b : blocks) convs->push_back(ConvBlock(b));
}

at::Tensor ConvStackImpl::forward(const at::Tensor& x) {
  at::Tensor h = x;
  for (size_t i = 0; i < convs->size(); ++i) h = convs->at<ConvBlockImpl>(i).forward(h);
  return h;
}

// -------------------------------------------------------------------------------- ResBlock

ResBlockImpl::ResBlockImpl(const ConvBlockOptions& c1, double slope)
    : conv1_options(c1), negative_slope(slope) {
  reset();
}

void ResBlockImpl::reset() {
  const ConvOptions& c = conv1_options.conv;
  conv1 = register_module("conv1", ConvBlock(conv1_options));
  ConvBlockOptions c2 = conv1_options;
  c2.conv.in_channels = c.out_channels;
  c2.conv.stride = 1;
  c2.act = ActOptions{ActKind::none};
  conv2 = register_module("conv2", ConvBlock(c2));
  pooled = !c.stride.all_equal(1);
  projected = c.in_channels != c.out_channels;
  skip = nullptr;
  if (!pooled && !projected) return;
  skip = register_module("skip", torch::nn::ModuleList());
  if (pooled) skip->push_back(torch::nn::Identity());  // the average pool: no tensors
  if (projected) {
    ConvBlockOptions p = c2;
    p.conv = ConvOptions{c.spatial_dims, c.in_channels, c.out_channels, 1, 1, 0, 0, false, /*bias=*/false};
    skip->push_back(ConvBlock(p));
  }
}

at::Tensor ResBlockImpl::forward(const at::Tensor& x) {
  at::Tensor residual = x;
  if (pooled) {
    const auto k = conv1_options.conv.stride.expand(conv1_options.conv.spatial_dims);
    residual = conv1_options.conv.spatial_dims == 3 ? at::avg_pool3d(residual, k, k)
                                                    : at::avg_pool2d(residual, k, k);
  }
  if (projected) residual = skip->at<ConvBlockImpl>(skip->size() - 1).forward(residual);
  at::Tensor out = conv2->forward(conv1->forward(x));
  return at::leaky_relu(out + residual, negative_slope);
}

// -------------------------------------------------------------------------------- ResStage

ResStageImpl::ResStageImpl(std::vector<ConvBlockOptions> c, double slope)
    : conv1s(std::move(c)), negative_slope(slope) {
  reset();
}

void ResStageImpl::reset() {
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (const auto& c : conv1s) blocks->push_back(ResBlock(c, negative_slope));
}

at::Tensor ResStageImpl::forward(const at::Tensor& x) {
  at::Tensor h = x;
  for (size_t i = 0; i < blocks->size(); ++i) h = blocks->at<ResBlockImpl>(i).forward(h);
  return h;
}

// ------------------------------------------------------------------------------ ResEncoder

ResEncoderImpl::ResEncoderImpl(ResEncUNetOptions o) : options(std::move(o)) { reset(); }

void ResEncoderImpl::reset() {
  const auto& o = options;
  const auto feats = o.features();
  const auto strides = o.resolved_strides();
  const auto kernels = o.resolved_kernel_sizes();
  const auto blocks = o.resolved_blocks();
  stem = register_module("stem", ConvStack(std::vector<ConvBlockOptions>{conv_block(
                                     o, o.in_channels, feats[0], kernels[0].dims(), 1, true, o.conv_bias)}));
  stages = register_module("stages", torch::nn::ModuleList());
  int64_t in = feats[0];
  for (size_t s = 0; s < feats.size(); ++s) {
    std::vector<ConvBlockOptions> conv1s;
    for (int64_t b = 0; b < blocks[s]; ++b)
      conv1s.push_back(conv_block(o, b == 0 ? in : feats[s], feats[s], kernels[s].dims(),
                                  b == 0 ? strides[s].dims() : DimSizes(1), true, o.conv_bias));
    stages->push_back(ResStage(conv1s, o.negative_slope));
    in = feats[s];
  }
}

std::vector<at::Tensor> ResEncoderImpl::forward(const at::Tensor& x) {
  // Each stage through recompute_stage: with train.activation_checkpointing only the stage
  // inputs are kept for backward (models/nets/recompute.hpp).
  at::Tensor h = stem->forward(x);
  std::vector<at::Tensor> skips;
  for (size_t s = 0; s < stages->size(); ++s) {
    auto& stage = stages->at<ResStageImpl>(s);
    h = recompute_stage(
        stage, [&stage](const at::Tensor& t) { return stage.forward(t); }, h);
    skips.push_back(h);
  }
  return skips;
}

// --------------------------------------------------------------------------- NnunetDecoder

NnunetDecoderImpl::NnunetDecoderImpl(ConvUNetTopology o) : options(std::move(o)) { reset(); }

void NnunetDecoderImpl::reset() {
  const auto& o = options;
  const auto feats = o.features();
  const auto strides = o.resolved_strides();
  const auto kernels = o.resolved_kernel_sizes();
  const auto n = feats.size();
  stages = register_module("stages", torch::nn::ModuleList());
  transpconvs = register_module("transpconvs", torch::nn::ModuleList());
  seg_layers = register_module("seg_layers", torch::nn::ModuleList());
  // Decoder stage s - 1 (lowest resolution first): upsample by the stride of stage n - s, join
  // the skip of stage n - s - 1 and convolve with that stage's kernel (nnU-Net's UNetDecoder).
  for (size_t s = 1; s < n; ++s) {
    const int64_t below = feats[n - s], skip = feats[n - s - 1];
    const DimSizes stride = strides[n - s].dims();
    transpconvs->push_back(ConvNd(
        ConvOptions{o.spatial_dims, below, skip, stride, stride, 0, 0, /*transposed=*/true, o.conv_bias}));
    std::vector<ConvBlockOptions> convs;
    for (int64_t c = 0; c < o.n_conv_per_stage_decoder; ++c)
      convs.push_back(
          conv_block(o, c == 0 ? 2 * skip : skip, skip, kernels[n - s - 1].dims(), 1, true, o.conv_bias));
    stages->push_back(ConvStack(convs));
    seg_layers->push_back(ConvNd(ConvOptions{o.spatial_dims, skip, o.num_classes, 1, 1, 0, 0, false, true}));
  }
}

std::vector<at::Tensor> NnunetDecoderImpl::forward(const std::vector<at::Tensor>& skips) {
  at::Tensor h = skips.back();
  std::vector<at::Tensor> outs;
  const size_t nd = stages->size();
  for (size_t d = 0; d < nd; ++d) {
    h = transpconvs->at<ConvNdImpl>(d).forward(h);
    h = at::cat({h, skips[nd - 1 - d]}, 1);
    auto& stage = stages->at<ConvStackImpl>(d);
    h = recompute_stage(
        stage, [&stage](const at::Tensor& t) { return stage.forward(t); }, h);
    if (options.deep_supervision || d == nd - 1) outs.push_back(seg_layers->at<ConvNdImpl>(d).forward(h));
  }
  std::reverse(outs.begin(), outs.end());
  return outs;
}

// ------------------------------------------------------------------------------ ResEncUNet

ResEncUNetImpl::ResEncUNetImpl(ResEncUNetOptions o) : options(std::move(o)) { reset(); }

void ResEncUNetImpl::reset() {
  auto st = options.validate();
  TORCH_CHECK(st.is_ok(), st.message());
  encoder = register_module("encoder", ResEncoder(options));
  decoder = register_module("decoder", NnunetDecoder(static_cast<const ConvUNetTopology&>(options)));
  // nnU-Net's initialisation (ResidualEncoderUNet.initialize): He-normal convs with LeakyReLU's
  // slope 1e-2 and zero biases, then each residual block's last norm at zero.
  torch::NoGradGuard no_grad;
  for (auto& m : modules(/*include_self=*/false)) {
    if (auto* conv = m->as<ConvNdImpl>()) {
      torch::nn::init::kaiming_normal_(conv->weight, 1e-2, torch::kFanIn, torch::kLeakyReLU);
      if (conv->bias.defined()) conv->bias.zero_();
    } else if (auto* block = m->as<ResBlockImpl>()) {
      if (block->conv2->norm && block->conv2->norm->weight.defined()) {
        block->conv2->norm->weight.zero_();
        block->conv2->norm->bias.zero_();
      }
    }
  }
}

std::vector<at::Tensor> ResEncUNetImpl::forward(const at::Tensor& x) {
  check_network_input("ResEncUNet", x, options.spatial_dims, options.in_channels, options.size_divisors());
  return decoder->forward(encoder->forward(x));
}

void ResEncUNetImpl::pretty_print(std::ostream& s) const {
  const auto& o = options;
  s << "segflow::models::ResEncUNet(spatial_dims=" << o.spatial_dims << ", in_channels=" << o.in_channels
    << ", num_classes=" << o.num_classes << ", features=" << sizes_text(o.features())
    << ", strides=" << to_string(o.resolved_strides())
    << ", kernel_sizes=" << to_string(o.resolved_kernel_sizes())
    << ", n_blocks_per_stage=" << sizes_text(o.resolved_blocks())
    << ", n_conv_per_stage_decoder=" << o.n_conv_per_stage_decoder
    << ", deep_supervision=" << (o.deep_supervision ? "true" : "false") << ")";
}

// --------------------------------------------------------------------------- nnU-Net names

std::vector<std::string> nnunet_res_enc_names(const std::string& name) {
  // A conv block's conv and norm are also its all_modules.0 and .1 (no dropout); the decoder
  // holds the encoder again as decoder.encoder.
  static const std::regex kBlock(R"((.*\.)(conv|norm)\.(\w+))");
  std::vector<std::string> names{name};
  std::smatch m;
  if (std::regex_match(name, m, kBlock) && name.rfind("decoder.transpconvs.", 0) != 0 &&
      name.rfind("decoder.seg_layers.", 0) != 0)
    names.push_back(m[1].str() + "all_modules." + (m[2] == "conv" ? "0." : "1.") + m[3].str());
  if (name.rfind("encoder.", 0) == 0) {
    const auto n = names.size();
    for (std::size_t i = 0; i < n; ++i) names.push_back("decoder." + names[i]);
  }
  return names;
}

// ---------------------------------------------------------------------- the network's row

namespace {

void bind_res_enc_unet(pipeline::OptionParser& p, ResEncUNetOptions& o) {
  bind_conv_unet_topology(p, o);
  p.integer_list("n_blocks_per_stage", o.n_blocks_per_stage, pipeline::Range::at_least(1), false,
                 "residual blocks per encoder stage (n_stages entries); [] = nnU-Net's 1, 3, 4, 6, 6, ...");
  if (p.ok()) p.check(o.validate(), "res_enc_unet");
}

Result<ModelHandle> build_res_enc_unet(const ResEncUNetOptions& o) {
  SEGFLOW_RETURN_IF_ERROR(o.validate());
  auto m = ResEncUNet(o).ptr();
  return ModelHandle(conv_unet_info("res_enc_unet", o), m,
                     [](torch::nn::Module& mod, const at::Tensor& x, const at::Tensor&) {
                       return static_cast<ResEncUNetImpl&>(mod).forward(x);
                     });
}

std::int64_t res_enc_unet_in_channels(const ResEncUNetOptions& o) { return o.in_channels; }

Result<ExportedModel> export_res_enc_unet(const ResEncUNetOptions& o, const torch::nn::Module& module) {
  return export_nnunet_unet(
      "res_enc_unet", "dynamic_network_architectures.architectures.unet.ResidualEncoderUNet", o, module,
      [](const std::string& name) { return Result<std::vector<std::string>>(nnunet_res_enc_names(name)); },
      {{"n_blocks_per_stage", o.resolved_blocks()}});
}

}  // namespace

NetworkRow res_enc_unet_network() {
  NetworkRow r =
      network_row<ResEncUNetOptions>("res_enc_unet", "nnU-Net's ResidualEncoderUNet", bind_res_enc_unet,
                                     build_res_enc_unet, res_enc_unet_in_channels);
  r.head_prefixes = {"decoder.seg_layers."};
  // segflow's modules carry nnU-Net's names: every name but the duplicates is its own.
  r.foreign_names = {nnunet_foreign_names("nnU-Net's ResidualEncoderUNet", "encoder.stem.",
                                          [](const std::string& n) { return n; })};
  r.pytorch = typed_hook<ResEncUNetOptions>(export_res_enc_unet);
  return r;
}

}  // namespace segflow::models
