#include "models/training/sliding_window.hpp"

#include <cmath>
#include <optional>

namespace segflow::models {
namespace F = torch::nn::functional;
using torch::indexing::Slice;

Status SlidingWindowOptions::validate(int spatial_dims) const {
  if (static_cast<int>(roi_size.size()) != spatial_dims)
    return invalid_argument("sliding window: roi_size: expected " + std::to_string(spatial_dims) +
                            " entries, got " + std::to_string(roi_size.size()));
  if (!(overlap >= 0.0 && overlap < 1.0))
    return invalid_argument("sliding window: overlap: expected a number in [0, 1), got " +
                            std::to_string(overlap));
  if (sw_batch_size < 1)
    return invalid_argument("sliding window: sw_batch_size: expected >= 1, got " +
                            std::to_string(sw_batch_size));
  if (mode == BlendMode::gaussian && !(sigma_scale > 0))
    return invalid_argument("sliding window: sigma_scale: expected > 0, got " + std::to_string(sigma_scale));
  if (!stitch_device.empty() && stitch_device != "cpu")
    return invalid_argument(
        "sliding window: stitch device: expected cpu or the model's device (empty), got " + stitch_device);
  return Status::ok();
}

std::vector<std::vector<int64_t>> window_starts(const std::vector<int64_t>& image_size,
                                                const std::vector<int64_t>& roi, double overlap) {
  std::vector<std::vector<int64_t>> starts;
  for (size_t d = 0; d < image_size.size(); ++d) {
    const int64_t size = image_size[d], patch = std::min(roi[d], image_size[d]);
    int64_t interval =
        patch == size ? patch : static_cast<int64_t>(static_cast<double>(patch) * (1.0 - overlap));
    interval = std::max<int64_t>(interval, 1);
    // Number of windows: the first index whose window reaches the end, plus one.
    int64_t count = 1;
    const int64_t num = (size + interval - 1) / interval;
    for (int64_t i = 0; i < num; ++i) {
      if (i * interval + patch >= size) {
        count = i + 1;
        break;
      }
    }
    std::vector<int64_t> s;
    for (int64_t i = 0; i < count; ++i) {
      int64_t start = i * interval;
      start -= std::max<int64_t>(start + patch - size, 0);
      s.push_back(start);
    }
    starts.push_back(std::move(s));
  }
  return starts;
}

at::Tensor importance_map(const std::vector<int64_t>& roi, BlendMode mode, double sigma_scale,
                          const at::TensorOptions& options) {
  auto fopts = options.dtype(torch::kFloat);
  if (mode == BlendMode::constant) return torch::ones(roi, fopts);
  at::Tensor map;
  for (size_t i = 0; i < roi.size(); ++i) {
    const double sigma = static_cast<double>(roi[i]) * sigma_scale;
    auto x = torch::arange(roi[i], fopts) - (static_cast<double>(roi[i]) - 1.0) / 2.0;
    x = torch::exp(x * x / (-2.0 * sigma * sigma));
    map = i == 0 ? x : map.unsqueeze(-1) * x;
  }
  const double min_non_zero = std::max(map.min().item<double>(), 1e-3);
  return map.clamp_min(min_non_zero);
}

at::Tensor sliding_window_inference(const at::Tensor& inputs, const SlidingWindowOptions& o,
                                    const Predictor& predictor) {
  const int D = static_cast<int>(inputs.dim()) - 2;
  TORCH_CHECK(D == 2 || D == 3,
              "sliding window: expected inputs (N, C, *spatial) with 2 or 3 spatial dims, got shape ",
              inputs.sizes());
  auto st = o.validate(D);
  TORCH_CHECK(st.is_ok(), st.message());
  std::optional<torch::NoGradGuard> guard;
  if (o.no_grad) guard.emplace();

  const auto original = inputs.sizes().slice(2).vec();
  std::vector<int64_t> roi(o.roi_size);
  for (int d = 0; d < D; ++d)
    if (roi[d] <= 0) roi[d] = original[d];
  // Pad each axis shorter than the ROI, half before and half after (F::pad lists the last dim first).
  std::vector<int64_t> pad(static_cast<size_t>(2 * D), 0), lo(static_cast<size_t>(D), 0);
  bool padded = false;
  for (int d = 0; d < D; ++d) {
    const int64_t diff = std::max<int64_t>(roi[d] - original[d], 0);
    lo[d] = diff / 2;
    pad[static_cast<size_t>(2 * (D - 1 - d))] = diff / 2;
    pad[static_cast<size_t>(2 * (D - 1 - d) + 1)] = diff - diff / 2;
    padded = padded || diff > 0;
  }
  at::Tensor image =
      padded ? F::pad(inputs, F::PadFuncOptions(pad).mode(torch::kConstant).value(o.padding_value)) : inputs;
  const auto size = image.sizes().slice(2).vec();
  const auto starts = window_starts(size, roi, o.overlap);

  // All window origins (row-major over the axes, as MONAI's meshgrid "ij").
  std::vector<std::vector<int64_t>> windows{{}};
  for (int d = 0; d < D; ++d) {
    std::vector<std::vector<int64_t>> next;
    for (const auto& w : windows)
      for (auto s : starts[d]) {
        auto v = w;
        v.push_back(s);
        next.push_back(std::move(v));
      }
    windows = std::move(next);
  }
  auto region = [&](const std::vector<int64_t>& w) {
    std::vector<at::indexing::TensorIndex> idx{Slice(), Slice()};
    for (int d = 0; d < D; ++d) idx.emplace_back(Slice(w[d], w[d] + roi[d]));
    return idx;
  };

  const int64_t N = image.size(0);
  const bool stitch_on_host = o.stitch_device == "cpu";
  at::Tensor output, count, weight;
  for (int64_t n = 0; n < N; ++n) {
    auto sample = image.index({Slice(n, n + 1)});
    for (size_t first = 0; first < windows.size(); first += static_cast<size_t>(o.sw_batch_size)) {
      const size_t last = std::min(windows.size(), first + static_cast<size_t>(o.sw_batch_size));
      std::vector<at::Tensor> crops;
      for (size_t i = first; i < last; ++i) crops.push_back(sample.index(region(windows[i])));
      auto pred = predictor(torch::cat(crops, 0));
      TORCH_CHECK(pred.dim() == D + 2 && pred.size(0) == static_cast<int64_t>(last - first) &&
                      pred.sizes().slice(2).vec() == roi,
                  "sliding window: the predictor returned shape ", pred.sizes(), " for ", last - first,
                  " windows of size ", at::IntArrayRef(roi));
      if (stitch_on_host && !pred.is_cpu()) pred = pred.to(torch::kCPU);
      if (!output.defined()) {
        std::vector<int64_t> shape{N, pred.size(1)};
        shape.insert(shape.end(), size.begin(), size.end());
        output = torch::zeros(shape, pred.options().dtype(torch::kFloat));
        std::vector<int64_t> cshape{1, 1};
        cshape.insert(cshape.end(), size.begin(), size.end());
        count = torch::zeros(cshape, output.options());
        // Made on the host (its minimum is read there: no device sync), copied once.
        weight = importance_map(roi, o.mode, o.sigma_scale, output.options().device(torch::kCPU));
        if (output.is_cuda()) weight = weight.pin_memory().to(output.device(), /*non_blocking=*/true);
        weight = weight.unsqueeze(0).unsqueeze(0);
      }
      auto out_n = output.index({Slice(n, n + 1)});
      for (size_t i = first; i < last; ++i) {
        const auto idx = region(windows[i]);
        auto p = pred.index({Slice(static_cast<int64_t>(i - first), static_cast<int64_t>(i - first + 1))})
                     .to(torch::kFloat);
        out_n.index(idx).add_(p * weight);
        if (n == 0) count.index(idx).add_(weight);
      }
    }
  }
  auto result = output / count;
  if (padded) {
    std::vector<at::indexing::TensorIndex> idx{Slice(), Slice()};
    for (int d = 0; d < D; ++d) idx.emplace_back(Slice(lo[d], lo[d] + original[d]));
    result = result.index(idx).contiguous();
  }
  return result;
}

}  // namespace segflow::models
