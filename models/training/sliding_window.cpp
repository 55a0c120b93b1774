#include "models/training/sliding_window.hpp"

#include <cmath>
#include <functional>
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
  if (mode != BlendMode::constant && !(sigma_scale > 0))
    return invalid_argument("sliding window: sigma_scale: expected > 0, got " + std::to_string(sigma_scale));
  if (!stitch_device.empty() && stitch_device != "cpu")
    return invalid_argument(
        "sliding window: stitch device: expected cpu or the model's device (empty), got " + stitch_device);
  return Status::ok();
}

BlendMode blend_mode(const std::string& name) {
  return name == "gaussian" ? BlendMode::gaussian
         : name == "nnunet" ? BlendMode::nnunet
                            : BlendMode::constant;
}

std::vector<std::vector<int64_t>> window_starts(const std::vector<int64_t>& image_size,
                                                const std::vector<int64_t>& roi, double overlap,
                                                BlendMode layout) {
  std::vector<std::vector<int64_t>> starts;
  for (size_t d = 0; d < image_size.size(); ++d) {
    const int64_t size = image_size[d], patch = std::min(roi[d], image_size[d]);
    if (layout == BlendMode::nnunet) {
      // As nnU-Net: the number of windows of a step of patch * (1 - overlap), then spread
      // evenly from 0 to size - patch (np.round: half to even, as nearbyint's default).
      const double target = static_cast<double>(patch) * (1.0 - overlap);
      const auto count = static_cast<int64_t>(std::ceil(static_cast<double>(size - patch) / target)) + 1;
      std::vector<int64_t> s;
      for (int64_t i = 0; i < count; ++i)
        s.push_back(count == 1 ? 0
                               : static_cast<int64_t>(std::nearbyint(static_cast<double>(size - patch) /
                                                                     static_cast<double>(count - 1) *
                                                                     static_cast<double>(i))));
      starts.push_back(std::move(s));
      continue;
    }
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
  if (mode == BlendMode::nnunet) {
    // nnU-Net's compute_gaussian: a unit impulse at roi / 2 through scipy's gaussian_filter
    // (sigma = sigma_scale * roi, truncated at int(4 sigma + 0.5)), zeros set to the smallest
    // non-zero weight. Its scale (max 10) cancels in the blend; computed in double.
    auto d64 = fopts.dtype(torch::kDouble);
    at::Tensor map;
    for (size_t i = 0; i < roi.size(); ++i) {
      const double sigma = static_cast<double>(roi[i]) * sigma_scale;
      const auto radius = static_cast<int64_t>(4.0 * sigma + 0.5);
      auto x = torch::arange(roi[i], d64) - static_cast<double>(roi[i] / 2);
      auto w = torch::exp(x * x / (-2.0 * sigma * sigma)) * (x.abs() <= static_cast<double>(radius));
      map = i == 0 ? w : map.unsqueeze(-1) * w;
    }
    const double smallest = map.masked_select(map > 0).min().item<double>();
    return map.masked_fill(map == 0, smallest).to(torch::kFloat);
  }
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

namespace {

/// The windows of one sliding-window pass: the input padded to at least the ROI, and every
/// window's origin (row-major over the axes: the first spatial axis outermost).
struct WindowGrid {
  at::Tensor image;  ///< the inputs, padded where shorter than the ROI
  std::vector<int64_t> original, size, roi, lo;
  bool padded = false;
  std::vector<std::vector<int64_t>> windows;

  std::vector<at::indexing::TensorIndex> region(const std::vector<int64_t>& w) const {
    std::vector<at::indexing::TensorIndex> idx{Slice(), Slice()};
    for (size_t d = 0; d < roi.size(); ++d) idx.emplace_back(Slice(w[d], w[d] + roi[d]));
    return idx;
  }
  /// `t` (N, C, *padded size) cut back to the inputs' size.
  at::Tensor crop(const at::Tensor& t) const {
    if (!padded) return t;
    std::vector<at::indexing::TensorIndex> idx{Slice(), Slice()};
    for (size_t d = 0; d < roi.size(); ++d) idx.emplace_back(Slice(lo[d], lo[d] + original[d]));
    return t.index(idx).contiguous();
  }
};

WindowGrid window_grid(const at::Tensor& inputs, const SlidingWindowOptions& o) {
  const int D = static_cast<int>(inputs.dim()) - 2;
  WindowGrid g;
  g.original = inputs.sizes().slice(2).vec();
  g.roi = o.roi_size;
  for (int d = 0; d < D; ++d)
    if (g.roi[d] <= 0) g.roi[d] = g.original[d];
  // Pad each axis shorter than the ROI, half before and half after (F::pad lists the last dim first).
  std::vector<int64_t> pad(static_cast<size_t>(2 * D), 0);
  g.lo.assign(static_cast<size_t>(D), 0);
  for (int d = 0; d < D; ++d) {
    const int64_t diff = std::max<int64_t>(g.roi[d] - g.original[d], 0);
    g.lo[d] = diff / 2;
    pad[static_cast<size_t>(2 * (D - 1 - d))] = diff / 2;
    pad[static_cast<size_t>(2 * (D - 1 - d) + 1)] = diff - diff / 2;
    g.padded = g.padded || diff > 0;
  }
  g.image = g.padded ? F::pad(inputs, F::PadFuncOptions(pad).mode(torch::kConstant).value(o.padding_value))
                     : inputs;
  g.size = g.image.sizes().slice(2).vec();
  const auto starts = window_starts(g.size, g.roi, o.overlap, o.mode);
  g.windows = {{}};
  for (int d = 0; d < D; ++d) {
    std::vector<std::vector<int64_t>> next;
    for (const auto& w : g.windows)
      for (auto s : starts[d]) {
        auto v = w;
        v.push_back(s);
        next.push_back(std::move(v));
      }
    g.windows = std::move(next);
  }
  return g;
}

/// Checks the options and the inputs' shape (N, C, *spatial), 2 or 3 spatial dims.
void check_inputs(const at::Tensor& inputs, const SlidingWindowOptions& o) {
  const int64_t D = inputs.dim() - 2;
  TORCH_CHECK(D == 2 || D == 3,
              "sliding window: expected inputs (N, C, *spatial) with 2 or 3 spatial dims, got shape ",
              inputs.sizes());
  auto st = o.validate(static_cast<int>(D));
  TORCH_CHECK(st.is_ok(), st.message());
}

/// Runs the windows of sample `n`, sw_batch_size at a time; `stitch(i, p)` gets window i's
/// prediction (1, C_out, *roi) as float, on the stitching device.
void run_windows(const WindowGrid& g, int64_t n, const SlidingWindowOptions& o, const Predictor& predictor,
                 const std::function<void(size_t, const at::Tensor&)>& stitch) {
  const auto sample = g.image.index({Slice(n, n + 1)});
  const bool stitch_on_host = o.stitch_device == "cpu";
  for (size_t first = 0; first < g.windows.size(); first += static_cast<size_t>(o.sw_batch_size)) {
    const size_t last = std::min(g.windows.size(), first + static_cast<size_t>(o.sw_batch_size));
    std::vector<at::Tensor> crops;
    for (size_t i = first; i < last; ++i) crops.push_back(sample.index(g.region(g.windows[i])));
    auto pred = predictor(torch::cat(crops, 0));
    TORCH_CHECK(pred.dim() == static_cast<int64_t>(g.roi.size()) + 2 &&
                    pred.size(0) == static_cast<int64_t>(last - first) &&
                    pred.sizes().slice(2).vec() == g.roi,
                "sliding window: the predictor returned shape ", pred.sizes(), " for ", last - first,
                " windows of size ", at::IntArrayRef(g.roi));
    if (stitch_on_host && !pred.is_cpu()) pred = pred.to(torch::kCPU);
    for (size_t i = first; i < last; ++i)
      stitch(i, pred.index({Slice(static_cast<int64_t>(i - first), static_cast<int64_t>(i - first + 1))})
                    .to(torch::kFloat));
  }
}

/// The window weights (1, 1, *roi) on `options`' device: made on the host (its minimum is
/// read there: no device sync), copied once.
at::Tensor window_weight(const WindowGrid& g, const SlidingWindowOptions& o,
                         const at::TensorOptions& options) {
  at::Tensor w = importance_map(g.roi, o.mode, o.sigma_scale, options.device(torch::kCPU));
  if (options.device().is_cuda()) w = w.pin_memory().to(options.device(), /*non_blocking=*/true);
  return w.unsqueeze(0).unsqueeze(0);
}

}  // namespace

at::Tensor sliding_window_inference(const at::Tensor& inputs, const SlidingWindowOptions& o,
                                    const Predictor& predictor) {
  check_inputs(inputs, o);
  std::optional<torch::NoGradGuard> guard;
  if (o.no_grad) guard.emplace();
  const WindowGrid g = window_grid(inputs, o);
  const int64_t N = g.image.size(0);
  at::Tensor output, count, weight;
  for (int64_t n = 0; n < N; ++n) {
    run_windows(g, n, o, predictor, [&](size_t i, const at::Tensor& p) {
      if (!output.defined()) {
        std::vector<int64_t> shape{N, p.size(1)};
        shape.insert(shape.end(), g.size.begin(), g.size.end());
        output = torch::zeros(shape, p.options());
        std::vector<int64_t> cshape{1, 1};
        cshape.insert(cshape.end(), g.size.begin(), g.size.end());
        count = torch::zeros(cshape, output.options());
        weight = window_weight(g, o, output.options());
      }
      const auto idx = g.region(g.windows[i]);
      output.index({Slice(n, n + 1)}).index(idx).add_(p * weight);
      if (n == 0) count.index(idx).add_(weight);
    });
  }
  output.div_(count);
  return g.crop(o.finish ? o.finish(output) : output);
}

at::Tensor sliding_window_labels(const at::Tensor& inputs, const SlidingWindowOptions& o,
                                 const Predictor& predictor) {
  check_inputs(inputs, o);
  TORCH_CHECK(inputs.size(0) == 1, "sliding window labels: expected one input (N = 1), got ", inputs.size(0));
  std::optional<torch::NoGradGuard> guard;
  if (o.no_grad) guard.emplace();
  const WindowGrid g = window_grid(inputs, o);
  const int64_t depth = g.roi[0];
  at::Tensor acc, count, weight, labels;
  int64_t base = 0;  // the first-axis index of acc's slice 0
  // Slices [base, end) are final (no window left covers them): their argmax is kept and the
  // accumulators move up by end - base (at most the ROI: windows never skip a slice).
  const auto finish = [&](int64_t end) {
    const int64_t n = end - base;
    if (n <= 0) return;
    at::Tensor done = acc.narrow(2, 0, n) / count.narrow(2, 0, n);
    if (o.finish) done = o.finish(done);
    labels.narrow(1, base, n).copy_(done.argmax(1).to(labels.scalar_type()));
    if (n < depth) {
      acc.narrow(2, 0, depth - n).copy_(acc.narrow(2, n, depth - n).clone());
      count.narrow(2, 0, depth - n).copy_(count.narrow(2, n, depth - n).clone());
    }
    acc.narrow(2, depth - n, n).zero_();
    count.narrow(2, depth - n, n).zero_();
    base = end;
  };
  run_windows(g, 0, o, predictor, [&](size_t i, const at::Tensor& p) {
    const std::vector<int64_t>& w = g.windows[i];
    if (!acc.defined()) {
      std::vector<int64_t> shape{1, p.size(1), depth};
      shape.insert(shape.end(), g.size.begin() + 1, g.size.end());
      acc = torch::zeros(shape, p.options());
      shape[1] = 1;
      count = torch::zeros(shape, p.options());
      weight = window_weight(g, o, p.options());
      std::vector<int64_t> lshape{1};
      lshape.insert(lshape.end(), g.size.begin(), g.size.end());
      labels = torch::empty(lshape, at::TensorOptions().dtype(p.size(1) <= 256 ? at::kByte : at::kShort));
    }
    finish(w[0]);  // windows come in first-axis order: everything before this one is done
    std::vector<int64_t> local = w;
    local[0] -= base;
    const auto idx = g.region(local);
    acc.index(idx).add_(p * weight);
    count.index(idx).add_(weight);
  });
  finish(base + depth);
  return g.crop(labels.unsqueeze(0)).squeeze(0);
}

}  // namespace segflow::models
