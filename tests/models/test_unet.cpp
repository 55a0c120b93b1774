// UNet (MONAI) and PlainConvUNet (nnU-Net): shapes, gradients, clone, options.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include "model_checks.hpp"
#include "models/nets/plain_unet.hpp"
#include "models/nets/unet.hpp"

using namespace segflow::models;
using segflow::testing::check_gradients;
using segflow::testing::max_abs_diff;
using segflow::testing::probe_loss;

TEST_CASE("a 2D MONAI UNet with plain conv blocks keeps the input size and trains every parameter") {
  torch::manual_seed(0);
  UNetOptions o;
  o.spatial_dims = 2;
  o.in_channels = 2;
  o.out_channels = 3;
  o.channels = {4, 8, 16};
  o.strides = {2, 2};
  o.num_res_units = 0;
  UNet net(o);
  auto x = torch::randn({2, 2, 16, 24});
  auto y = net->forward(x);
  CHECK(y.sizes() == at::IntArrayRef({2, 3, 16, 24}));
  probe_loss(y).backward();
  check_gradients(*net);
  // MONAI's top up layer is a bare transposed conv: no norm and no activation after it.
  auto& top = net->up->at<UpLayerImpl>(0);
  CHECK(top.conv->options.conv_only);
  CHECK_FALSE(top.ru);
}

TEST_CASE("the MONAI fast-training UNet config runs forward and backward on a 32^3 volume") {
  torch::manual_seed(0);
  UNetOptions o;  // monai.networks.nets.UNet(3, 1, 2, (16, 32, 64, 128, 256), (2, 2, 2, 2), num_res_units=2,
                  // norm=BATCH)
  o.spatial_dims = 3;
  o.in_channels = 1;
  o.out_channels = 2;
  o.num_res_units = 2;
  o.norm = NormKind::batch;
  UNet net(o);
  // MONAI's model has 4,808,917 parameters in this configuration.
  int64_t count = 0;
  for (const auto& p : net->parameters()) count += p.numel();
  CHECK(count == 4808917);
  auto x = torch::randn({2, 1, 32, 32, 32});
  auto y = net->forward(x);
  CHECK(y.sizes() == at::IntArrayRef({2, 2, 32, 32, 32}));
  probe_loss(y).backward();
  check_gradients(*net);
  // Residual units: the strided down units have a strided 3x3x3 residual conv.
  auto& d0 = net->down->at<ResidualUnitImpl>(0);
  REQUIRE(d0.residual);
  CHECK(d0.residual->options.kernel_size == 3);
  CHECK(d0.residual->options.stride == 2);
  CHECK(d0.conv->size() == 2);
}

TEST_CASE("the MONAI fast-training UNet config predicts a 96^3 volume in evaluation mode") {
  torch::manual_seed(0);
  UNetOptions o;
  o.num_res_units = 2;
  o.norm = NormKind::batch;
  UNet net(o);
  net->eval();
  torch::NoGradGuard no_grad;
  auto y = net->forward(torch::randn({1, 1, 96, 96, 96}));
  CHECK(y.sizes() == at::IntArrayRef({1, 2, 96, 96, 96}));
  CHECK(torch::isfinite(y).all().item<bool>());
}

TEST_CASE("a 3D UNet with instance norm, leaky ReLU, dropout and one residual unit trains") {
  torch::manual_seed(1);
  UNetOptions o;
  o.channels = {4, 8, 8};
  o.strides = {2, 1};
  o.num_res_units = 1;
  o.norm = NormKind::instance;
  o.act = ActKind::leakyrelu;
  o.dropout = 0.1;
  UNet net(o);
  auto y = net->forward(torch::randn({1, 1, 8, 12, 16}));
  CHECK(y.sizes() == at::IntArrayRef({1, 2, 8, 12, 16}));
  probe_loss(y).backward();
  check_gradients(*net);
  // Stride 1 with a channel change: a 1x1 residual conv.
  auto& d1 = net->down->at<ResidualUnitImpl>(1);
  REQUIRE(d1.residual);
  CHECK(d1.residual->options.kernel_size == 1);
}

TEST_CASE("a cloned UNet gives identical outputs and owns its parameters") {
  torch::manual_seed(2);
  UNetOptions o;
  o.channels = {4, 8, 16};
  o.strides = {2, 2};
  o.num_res_units = 2;
  o.norm = NormKind::batch;
  UNet net(o);
  auto x = torch::randn({2, 1, 8, 8, 8});
  net->forward(x);  // moves the batch-norm running statistics away from their initial values
  net->eval();
  auto copy = std::dynamic_pointer_cast<UNetImpl>(net->clone());
  REQUIRE(copy);
  copy->eval();
  torch::NoGradGuard no_grad;
  auto a = net->forward(x), b = copy->forward(x);
  CHECK(max_abs_diff(a, b) == 0.0);
  CHECK(copy->named_parameters().size() == net->named_parameters().size());
  for (auto& p : copy->parameters()) p.add_(1.0);
  CHECK(max_abs_diff(net->forward(x), a) == 0.0);
  CHECK(max_abs_diff(copy->forward(x), a) > 0.0);
}

TEST_CASE("UNet options are validated and inputs of the wrong size are rejected with a message") {
  UNetOptions o;
  o.strides = {2, 2};
  auto st = o.validate();
  CHECK_FALSE(st.is_ok());
  CHECK(st.message().find("strides") != std::string::npos);
  o = UNetOptions{};
  o.kernel_size = 4;
  CHECK(o.validate().message().find("kernel_size") != std::string::npos);
  o = UNetOptions{};
  o.channels = {4, 8};
  o.strides = {2};
  UNet net(o);
  CHECK_THROWS_WITH_AS(net->forward(torch::randn({1, 1, 7, 8, 8})), doctest::Contains("divisible by 2"),
                       c10::Error);
  CHECK_THROWS_WITH_AS(net->forward(torch::randn({1, 2, 8, 8, 8})), doctest::Contains("input channels"),
                       c10::Error);
}

TEST_CASE("PlainConvUNet with deep supervision returns full resolution first and halves each output") {
  torch::manual_seed(3);
  PlainConvUNetOptions o;
  o.n_stages = 4;
  o.base_features = 4;
  o.max_features = 12;
  o.num_classes = 3;
  PlainConvUNet net(o);
  CHECK(o.features() == std::vector<int64_t>{4, 8, 12, 12});
  auto outs = net->forward(torch::randn({2, 1, 16, 16, 16}));
  REQUIRE(outs.size() == 3);
  CHECK(outs[0].sizes() == at::IntArrayRef({2, 3, 16, 16, 16}));
  CHECK(outs[1].sizes() == at::IntArrayRef({2, 3, 8, 8, 8}));
  CHECK(outs[2].sizes() == at::IntArrayRef({2, 3, 4, 4, 4}));
  at::Tensor loss = probe_loss(outs[0]) + probe_loss(outs[1], 8) + probe_loss(outs[2], 9);
  loss.backward();
  check_gradients(*net);
  // nnU-Net blocks: conv, instance norm (affine), LeakyReLU(0.01).
  auto& block = net->encoder_stages->at<torch::nn::ModuleListImpl>(0).at<ConvBlockImpl>(0);
  CHECK(block.norm->options.kind == NormKind::instance);
  CHECK(block.act->options.kind == ActKind::leakyrelu);
  CHECK(block.act->options.negative_slope == doctest::Approx(0.01));
}

TEST_CASE("PlainConvUNet without deep supervision returns one full-resolution output in 2D") {
  torch::manual_seed(4);
  PlainConvUNetOptions o;
  o.spatial_dims = 2;
  o.n_stages = 3;
  o.base_features = 4;
  o.deep_supervision = false;
  PlainConvUNet net(o);
  auto outs = net->forward(torch::randn({1, 1, 16, 12}));
  REQUIRE(outs.size() == 1);
  CHECK(outs[0].sizes() == at::IntArrayRef({1, 2, 16, 12}));
  auto copy = std::dynamic_pointer_cast<PlainConvUNetImpl>(net->clone());
  net->eval();
  copy->eval();
  auto x = torch::randn({1, 1, 8, 8});
  CHECK(max_abs_diff(net->forward(x)[0], copy->forward(x)[0]) == 0.0);
}
