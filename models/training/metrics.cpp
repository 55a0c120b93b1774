#include "models/training/metrics.hpp"

#include <cmath>
#include <limits>

namespace segflow::models {
namespace {

at::Tensor as_label_map(const at::Tensor& t) {
  // (N, 1, *spatial) and (N, *spatial) both become (N, *spatial).
  return (t.dim() >= 3 && t.size(1) == 1) ? t.squeeze(1) : t;
}
}  // namespace

at::Tensor dice_per_case(const at::Tensor& pred_in, const at::Tensor& target_in, const DiceMetricOptions& o) {
  TORCH_CHECK(o.num_classes >= 1, "dice metric: num_classes must be >= 1");
  auto pred = as_label_map(pred_in).to(torch::kLong);
  auto target = as_label_map(target_in).to(torch::kLong);
  TORCH_CHECK(pred.sizes() == target.sizes(), "dice metric: prediction shape ", pred_in.sizes(),
              " does not match target shape ", target_in.sizes());
  TORCH_CHECK(pred.dim() >= 2, "dice metric: expected label maps (N, [1,] *spatial), got shape ",
              pred_in.sizes());
  const int64_t first = o.include_background ? 0 : 1;
  const int64_t K = o.num_classes - first;
  const int64_t N = pred.size(0);
  auto out = torch::full({N, std::max<int64_t>(K, 0)}, kNaN, torch::kDouble);
  if (K <= 0) return out;
  auto classes = torch::arange(first, o.num_classes, pred.options());
  std::vector<int64_t> view(static_cast<size_t>(pred.dim() + 1), 1);
  view[1] = K;
  classes = classes.view(view);
  auto p = pred.unsqueeze(1).eq(classes);  // (N, K, *spatial) bool
  auto g = target.unsqueeze(1).eq(classes);
  std::vector<int64_t> axes;
  for (int64_t d = 2; d < p.dim(); ++d) axes.push_back(d);
  auto inter = (p & g).sum(axes).to(torch::kCPU, torch::kDouble);
  auto ps = p.sum(axes).to(torch::kCPU, torch::kDouble);
  auto gs = g.sum(axes).to(torch::kCPU, torch::kDouble);
  auto a = out.accessor<double, 2>();
  auto ia = inter.accessor<double, 2>(), pa = ps.accessor<double, 2>(), ga = gs.accessor<double, 2>();
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      const double I = ia[n][k], P = pa[n][k], G = ga[n][k];
      if (G > 0) {
        a[n][k] = 2.0 * I / (P + G);
      } else if (o.empty == EmptyClassPolicy::ignore_empty_target) {
        a[n][k] = kNaN;
      } else if (P > 0) {
        a[n][k] = 0.0;
      } else {
        a[n][k] = o.empty == EmptyClassPolicy::both_empty_is_one ? 1.0 : kNaN;
      }
    }
  }
  return out;
}

at::Tensor labels_from_logits(const at::Tensor& logits) {
  TORCH_CHECK(logits.dim() >= 3, "labels_from_logits: expected (N, C, *spatial), got shape ", logits.sizes());
  if (logits.size(1) == 1) return logits.gt(0).to(torch::kLong);
  return logits.argmax(1, /*keepdim=*/true);
}

DiceMetric::DiceMetric(DiceMetricOptions options) : options_(options) {}

void DiceMetric::update(const at::Tensor& pred, const at::Tensor& target) {
  auto d = dice_per_case(pred, target, options_);
  auto a = d.accessor<double, 2>();
  for (int64_t n = 0; n < d.size(0); ++n) {
    std::vector<double> row(static_cast<size_t>(d.size(1)));
    for (int64_t k = 0; k < d.size(1); ++k) row[static_cast<size_t>(k)] = a[n][k];
    cases_.push_back(std::move(row));
  }
}

void DiceMetric::update_from_logits(const at::Tensor& logits, const at::Tensor& target) {
  update(labels_from_logits(logits), target);
}

void DiceMetric::merge(const DiceMetric& other) {
  cases_.insert(cases_.end(), other.cases_.begin(), other.cases_.end());
}

std::vector<double> DiceMetric::per_class() const {
  const size_t K =
      static_cast<size_t>(std::max<int64_t>(options_.num_classes - (options_.include_background ? 0 : 1), 0));
  std::vector<double> sum(K, 0.0), count(K, 0.0);
  for (const auto& row : cases_) {
    for (size_t k = 0; k < K && k < row.size(); ++k) {
      if (!std::isnan(row[k])) sum[k] += row[k], count[k] += 1;
    }
  }
  std::vector<double> out(K);
  for (size_t k = 0; k < K; ++k) out[k] = count[k] > 0 ? sum[k] / count[k] : kNaN;
  return out;
}

double DiceMetric::mean() const {
  double total = 0, cases = 0;
  for (const auto& row : cases_) {
    double s = 0, c = 0;
    for (double v : row)
      if (!std::isnan(v)) s += v, c += 1;
    if (c > 0) total += s / c, cases += 1;
  }
  return cases > 0 ? total / cases : kNaN;
}

double DiceMetric::mean_of_classes() const {
  double s = 0, c = 0;
  for (double v : per_class())
    if (!std::isnan(v)) s += v, c += 1;
  return c > 0 ? s / c : kNaN;
}

}  // namespace segflow::models
