#pragma once
// Per-class Dice from label maps, accumulated over batches and cases (MONAI DiceMetric).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <limits>
#include <vector>

namespace segflow::models {

/// The score of what is not scored (an excluded empty class, a metric without a value).
inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

/// What a (case, class) pair scores when the class is empty.
enum class EmptyClassPolicy {
  ignore_empty_target,  ///< target empty -> NaN, excluded (MONAI ignore_empty=True; default)
  ignore_both_empty,    ///< both empty -> NaN, excluded; only predicted -> 0
  both_empty_is_one,    ///< both empty -> 1; only predicted -> 0 (MONAI ignore_empty=False)
};

struct DiceMetricOptions {
  int64_t num_classes = 2;          ///< label values 0 .. num_classes - 1, incl. background
  bool include_background = false;  ///< score class 0 too
  EmptyClassPolicy empty = EmptyClassPolicy::ignore_empty_target;
};

/// Dice per (case, class) of one batch: (N, K) float64 on the CPU, K = num_classes or
/// num_classes - 1 without background; NaN where `empty` says to exclude. pred and target are
/// integer label maps of equal shape (N, 1, *spatial) or (N, *spatial).
at::Tensor dice_per_case(const at::Tensor& pred, const at::Tensor& target, const DiceMetricOptions& options);

/// Label map from logits (N, C, *spatial): argmax over C (C > 1) or logits > 0 (C == 1);
/// (N, 1, *spatial) int64.
at::Tensor labels_from_logits(const at::Tensor& logits);

/// Accumulates Dice over batches and cases. Not thread-safe; one per validation run.
class DiceMetric {
 public:
  explicit DiceMetric(DiceMetricOptions options = {});
  /// Adds the cases of one batch of label maps.
  void update(const at::Tensor& pred, const at::Tensor& target);
  /// Adds the cases of one batch of logits (see labels_from_logits).
  void update_from_logits(const at::Tensor& logits, const at::Tensor& target);
  /// Adds another metric's cases (e.g. from another rank); same options expected.
  void merge(const DiceMetric& other);
  /// Per class: mean over cases of the non-NaN scores; NaN for a class never scored
  /// (MONAI reduction "mean_batch").
  std::vector<double> per_class() const;
  /// Per case the mean over its non-NaN classes, then the mean over cases that had any
  /// (MONAI reduction "mean"); NaN when nothing was scored.
  double mean() const;
  /// Mean over classes of per_class(), skipping NaN.
  double mean_of_classes() const;
  /// Scores so far, one row per case.
  const std::vector<std::vector<double>>& cases() const { return cases_; }
  void reset() { cases_.clear(); }
  const DiceMetricOptions& options() const { return options_; }

 private:
  DiceMetricOptions options_;
  std::vector<std::vector<double>> cases_;
};

}  // namespace segflow::models
