#pragma once
// A BatchSource that replays batches already in memory (on the trainer's device): what
// `segflow bench` uses to time the pure compute step, the limit any data path can reach.

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "pipeline/batch_source.hpp"

namespace segflow::pipeline {

class StagedBatchSource : public BatchSource {
 public:
  /// Every epoch yields `steps` batches, cycling through `batches` (not empty).
  StagedBatchSource(std::vector<Batch> batches, std::int64_t steps)
      : batches_(std::move(batches)), steps_(steps) {}
  Status start_epoch(std::int64_t) override {
    served_ = 0;
    return Status::ok();
  }
  Result<std::optional<Batch>> next() override {
    if (batches_.empty() || served_ >= steps_) return std::optional<Batch>{};
    return std::optional<Batch>{batches_[static_cast<std::size_t>(served_++) % batches_.size()]};
  }
  std::vector<CaseFailure> take_failures() override { return {}; }
  double last_wait_s() const override { return 0.0; }

 private:
  std::vector<Batch> batches_;
  std::int64_t steps_;
  std::int64_t served_ = 0;
};

/// Wraps a source and keeps a copy of the first `keep` batches it hands out.
class RecordingBatchSource : public BatchSource {
 public:
  RecordingBatchSource(BatchSource& inner, std::size_t keep) : inner_(inner), keep_(keep) {}
  Status start_epoch(std::int64_t e) override { return inner_.start_epoch(e); }
  Result<std::optional<Batch>> next() override {
    auto b = inner_.next();
    if (b.is_ok() && *b && recorded_.size() < keep_) recorded_.push_back(**b);
    return b;
  }
  std::vector<CaseFailure> take_failures() override { return inner_.take_failures(); }
  double last_wait_s() const override { return inner_.last_wait_s(); }
  std::vector<Batch> take_recorded() { return std::move(recorded_); }

 private:
  BatchSource& inner_;
  std::size_t keep_;
  std::vector<Batch> recorded_;
};

}  // namespace segflow::pipeline
