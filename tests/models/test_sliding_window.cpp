// Sliding-window inference against the direct forward.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include "model_checks.hpp"
#include "models/nets/unet.hpp"
#include "models/training/sliding_window.hpp"
#include "test_util.hpp"

using namespace segflow::models;
using segflow::testing::max_abs_diff;

TEST_CASE("window starts cover the axis with the last window flush with the end") {
  CHECK(window_starts({10}, {4}, 0.5) == std::vector<std::vector<int64_t>>{{0, 2, 4, 6}});
  CHECK(window_starts({10}, {4}, 0.0) == std::vector<std::vector<int64_t>>{{0, 4, 6}});
  CHECK(window_starts({8, 5}, {8, 4}, 0.25) == std::vector<std::vector<int64_t>>{{0}, {0, 1}});
}

TEST_CASE("the Gaussian importance map peaks at the centre with sigma 0.125 of the ROI") {
  auto w = importance_map({9, 9}, BlendMode::gaussian, 0.125, torch::TensorOptions());
  CHECK(w[4][4].item<double>() == doctest::Approx(1.0));
  const double sigma = 9 * 0.125;
  CHECK(w[4][0].item<double>() == doctest::Approx(std::exp(-16.0 / (2 * sigma * sigma))).epsilon(1e-5));
  CHECK(max_abs_diff(w, w.transpose(0, 1)) < 1e-7);
  CHECK(w.min().item<double>() >= 1e-3);
  CHECK(importance_map({3, 4}, BlendMode::constant, 0.125, torch::TensorOptions()).sum().item<double>() ==
        12.0);
}

TEST_CASE("sliding-window inference reproduces the full-volume forward when the ROI covers the volume") {
  torch::manual_seed(0);
  UNetOptions o;
  o.channels = {4, 8, 16};
  o.strides = {2, 2};
  o.num_res_units = 1;
  UNet net(o);
  net->eval();
  auto x = torch::randn({2, 1, 8, 12, 16});
  torch::NoGradGuard no_grad;
  auto direct = net->forward(x);
  SlidingWindowOptions sw;
  sw.roi_size = {8, 12, 16};
  auto y = sliding_window_inference(x, sw, [&](const at::Tensor& b) { return net->forward(b); });
  CHECK(max_abs_diff(direct, y) < 1e-5);  // windows run one sample at a time: float rounding differs
  sw.roi_size = {-1, 0, 16};              // non-positive: the whole axis
  CHECK(max_abs_diff(direct, sliding_window_inference(
                                 x, sw, [&](const at::Tensor& b) { return net->forward(b); })) < 1e-5);
}

TEST_CASE(
    "overlapping Gaussian-weighted windows of a pointwise model equal the direct forward in 3D and 2D") {
  torch::manual_seed(1);
  ConvNd conv(ConvOptions{3, 2, 3, 1, 1, 0});  // 1x1x1 conv: translation equivariant
  auto x = torch::randn({2, 2, 13, 20, 17});
  torch::NoGradGuard no_grad;
  int calls = 0;
  auto pred = [&](const at::Tensor& b) {
    ++calls;
    CHECK(b.size(0) <= 3);
    return conv->forward(b);
  };
  SlidingWindowOptions sw;
  sw.roi_size = {8, 8, 8};
  sw.overlap = 0.5;
  sw.sw_batch_size = 3;
  sw.mode = BlendMode::gaussian;
  auto y = sliding_window_inference(x, sw, pred);
  CHECK(y.sizes() == at::IntArrayRef({2, 3, 13, 20, 17}));
  CHECK(max_abs_diff(y, conv->forward(x)) < 1e-5);
  CHECK(calls > 2);

  ConvNd conv2(ConvOptions{2, 1, 2, 1, 1, 0});
  auto x2 = torch::randn({1, 1, 30, 21});
  SlidingWindowOptions s2;
  s2.roi_size = {16, 16};
  s2.overlap = 0.25;
  CHECK(max_abs_diff(sliding_window_inference(x2, s2, [&](const at::Tensor& b) { return conv2->forward(b); }),
                     conv2->forward(x2)) < 1e-5);
}

TEST_CASE("a volume smaller than the ROI is padded for the predictor and cropped back") {
  ConvNd conv(ConvOptions{3, 1, 2, 1, 1, 0});
  auto x = torch::randn({1, 1, 5, 7, 9});
  torch::NoGradGuard no_grad;
  SlidingWindowOptions sw;
  sw.roi_size = {8, 8, 8};
  auto y = sliding_window_inference(x, sw, [&](const at::Tensor& b) {
    CHECK(b.sizes() == at::IntArrayRef({1, 1, 8, 8, 8}));  // z, y padded to 8; x (9) takes two windows
    return conv->forward(b);
  });
  CHECK(y.sizes() == at::IntArrayRef({1, 2, 5, 7, 9}));
  CHECK(max_abs_diff(y, conv->forward(x)) < 1e-6);
}

TEST_CASE("bad sliding-window options and predictor outputs are reported") {
  SlidingWindowOptions sw;
  sw.roi_size = {8, 8};
  CHECK(sw.validate(3).message().find("roi_size") != std::string::npos);
  sw.roi_size = {8, 8, 8};
  sw.overlap = 1.0;
  CHECK(sw.validate(3).message().find("overlap") != std::string::npos);
  sw.overlap = 0.25;
  auto x = torch::zeros({1, 1, 8, 8, 8});
  CHECK_THROWS_WITH_AS(sliding_window_inference(x, sw,
                                                [](const at::Tensor& b) {
                                                  return b.index({"...", torch::indexing::Slice(0, 4)});
                                                }),
                       doctest::Contains("predictor returned"), c10::Error);
}

TEST_CASE("streamed labels equal the argmax of the stitched probabilities, slab by slab, in 3D and 2D") {
  torch::manual_seed(4);
  torch::NoGradGuard no_grad;
  // A 3x3(x3) convolution sees the window's edges: overlapping windows predict a voxel
  // differently, so the blend order and weights matter and are checked exactly.
  for (int dims : {3, 2}) {
    ConvNd conv(ConvOptions{dims, 2, 4, 3, 1, 1});
    const auto logits = [&](const at::Tensor& b) { return conv->forward(b); };
    const auto pred = [&](const at::Tensor& b) { return torch::softmax(conv->forward(b), 1); };
    const std::vector<std::vector<int64_t>> shapes =
        dims == 3 ? std::vector<std::vector<int64_t>>{{1, 2, 23, 19, 17}, {1, 2, 5, 30, 9}}
                  : std::vector<std::vector<int64_t>>{{1, 2, 31, 13}, {1, 2, 6, 22}};
    for (const auto& shape : shapes) {
      const auto x = torch::randn(shape);
      for (double overlap : {0.0, 0.25, 0.5, 0.8})
        for (int64_t batch : {1, 3})
          for (BlendMode mode : {BlendMode::constant, BlendMode::gaussian, BlendMode::nnunet}) {
            SlidingWindowOptions sw;
            sw.roi_size = dims == 3 ? std::vector<int64_t>{8, 8, 8} : std::vector<int64_t>{8, 8};
            sw.overlap = overlap;
            sw.sw_batch_size = batch;
            sw.mode = mode;
            CAPTURE(dims);
            CAPTURE(overlap);
            CAPTURE(batch);
            // nnU-Net's mode blends logits and applies the softmax after (`finish`).
            const bool after = mode == BlendMode::nnunet;
            if (after) sw.finish = [](const at::Tensor& t) { return torch::softmax(t, 1); };
            const at::Tensor probs =
                sliding_window_inference(x, sw, after ? Predictor(logits) : Predictor(pred));
            const at::Tensor labels =
                sliding_window_labels(x, sw, after ? Predictor(logits) : Predictor(pred));
            if (after) CHECK((probs.sum(1) - 1).abs().max().item<double>() < 1e-5);
            CHECK((labels.scalar_type() == at::kByte));
            REQUIRE(labels.sizes() == probs.argmax(1).sizes());
            CHECK(torch::equal(labels, probs.argmax(1).to(at::kByte)));
          }
    }
  }
  ConvNd conv(ConvOptions{3, 1, 2, 3, 1, 1});
  SlidingWindowOptions sw;
  sw.roi_size = {4, 4, 4};
  std::string error;
  try {
    sliding_window_labels(torch::zeros({2, 1, 8, 8, 8}), sw,
                          [&](const at::Tensor& b) { return conv->forward(b); });
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  }
  CHECK_MESSAGE(error.find("expected one input (N = 1), got 2") != std::string::npos, error);
}

TEST_CASE(
    "nnU-Net's layout and Gaussian are nnunetv2's compute_steps_for_sliding_window and compute_gaussian") {
  // By hand: 155 voxels, patch 32, step 0.5: ceil(123 / 16) + 1 = 9 windows, 15.375 apart,
  // rounded half to even (61.5 -> 62).
  CHECK(window_starts({155}, {32}, 0.5, BlendMode::nnunet) ==
        std::vector<std::vector<int64_t>>{{0, 15, 31, 46, 62, 77, 92, 108, 123}});
  CHECK(window_starts({32, 10}, {32, 4}, 0.5, BlendMode::nnunet) ==
        std::vector<std::vector<int64_t>>{{0}, {0, 2, 4, 6}});
  // Against nnunetv2 itself, in the venv.
  const std::vector<std::vector<int64_t>> cases = {{110, 64}, {155, 32}, {97, 40}, {301, 96}, {64, 64}};
  const std::string code =
      "import sys, json, torch\n"
      "from nnunetv2.inference.sliding_window_prediction import compute_steps_for_sliding_window as s, "
      "compute_gaussian as g\n"
      "c = json.loads(sys.argv[1])\n"
      "steps = [s((i,), (k,), f)[0] for i, k in c for f in (0.5, 0.25, 0.75)]\n"
      "m = g((16, 20, 12), 1. / 8, 1, dtype=torch.float64, device=torch.device('cpu'))\n"
      "print(json.dumps({'steps': steps, 'gaussian': (m / m.max()).flatten().tolist()}))\n";
  const auto j = nlohmann::json::parse(segflow::testing::run_python(code, {nlohmann::json(cases).dump()}));
  std::size_t at = 0;
  for (const auto& c : cases)
    for (double step : {0.5, 0.25, 0.75}) {
      CAPTURE(c[0]);
      CAPTURE(step);
      CHECK(window_starts({c[0]}, {c[1]}, 1.0 - step, BlendMode::nnunet)[0] ==
            j["steps"][at++].get<std::vector<int64_t>>());
    }
  const at::Tensor ours = importance_map({16, 20, 12}, BlendMode::nnunet, 0.125, torch::TensorOptions());
  const at::Tensor theirs = torch::tensor(j["gaussian"].get<std::vector<double>>(), torch::kDouble)
                                .reshape({16, 20, 12})
                                .to(torch::kFloat);
  CHECK(max_abs_diff(ours / ours.max(), theirs) < 1e-6);
}
