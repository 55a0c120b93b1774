#pragma once
// Small training jobs for the model tests: a config for one model on the CPU or a GPU, batches
// a network can learn in a few steps, and an observer that records the steps.

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "job_yaml.hpp"
#include "models/training/job_config.hpp"
#include "models/training/trainer.hpp"
#include "pipeline/staged_source.hpp"
#include "test_util.hpp"

namespace segflow::testing::train {

using models::EpochInfo;
using models::JobConfig;
using models::StepInfo;
using models::Trainer;
using models::TrainObserver;

/// The DiceCE loss on logits and integer labels.
inline const char* kDiceCe = "{name: dice_ce, to_onehot_y: true, softmax: true}";

/// A job with one model, trained on `device` under `amp`, every step logged by default.
inline JobConfig job(const std::string& model, const std::string& loss, const std::string& amp,
                     const std::string& optimizer = "{name: adam, lr: 0.01}", std::int64_t log_every = 1,
                     const std::string& device = "cpu") {
  JobYaml job;
  job.name = "amp";
  job.seed = "1";
  job.stages = {"load"};
  job.model = model;
  job.loss = loss;
  job.optimizer = optimizer;
  job.epochs = 1;
  job.train = "batch_size: 2, amp: " + amp + ", device: " + device +
              ", threads: 2, log_every: " + std::to_string(log_every);
  job.validation = "";
  REQUIRE_OK_AND_ASSIGN(auto c, models::parse_job_config(job.yaml(), "amp.yaml"));
  return c;
}

/// Two samples whose label is a box (class 1) and a slab (class 2); the image shows them.
inline Batch segmentation_batch(const std::vector<std::int64_t>& spatial) {
  std::vector<std::int64_t> shape{2, 1};
  shape.insert(shape.end(), spatial.begin(), spatial.end());
  at::Tensor label = at::zeros(shape, at::kLong);
  using at::indexing::Slice;
  if (spatial.size() == 3) {
    label.index_put_({Slice(), Slice(), Slice(2, 8), Slice(3, 10), Slice(4, 12)}, 1);
    label.index_put_({Slice(), Slice(), Slice(10, 14), Slice(), Slice()}, 2);
  } else {
    label.index_put_({Slice(), Slice(), Slice(3, 10), Slice(4, 12)}, 1);
    label.index_put_({Slice(), Slice(), Slice(12, 15), Slice()}, 2);
  }
  auto gen = at::make_generator<at::CPUGeneratorImpl>(4);
  at::Tensor image = label.to(at::kFloat) * 0.5 + 0.1 * at::randn(shape, gen, at::TensorOptions());
  Batch b;
  b.ids = {"a", "b"};
  b.tensors["image"] = image;
  b.tensors["label"] = label;
  return b;
}

/// Box-prompted 2D batch: a bright square, its box and its mask.
inline Batch sam_batch(std::int64_t size) {
  at::Tensor mask = at::zeros({2, 1, size, size});
  using at::indexing::Slice;
  mask.index_put_({0, Slice(), Slice(4, 20), Slice(6, 22)}, 1.0);
  mask.index_put_({1, Slice(), Slice(10, 28), Slice(2, 14)}, 1.0);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  Batch b;
  b.ids = {"a", "b"};
  b.tensors["image"] =
      (mask * 0.8 + 0.1 * at::randn(mask.sizes(), gen, at::TensorOptions())).repeat({1, 3, 1, 1});
  b.tensors["label"] = mask;
  b.tensors["box"] = torch::tensor({{6.0, 4.0, 22.0, 20.0}, {2.0, 10.0, 14.0, 28.0}});
  return b;
}

/// Records every step.
struct Steps : TrainObserver {
  std::vector<StepInfo> steps;
  void on_step(const StepInfo& i) override { steps.push_back(i); }
};

/// Trains `steps` steps on the same batch; returns the logged per-step losses.
inline std::vector<double> train_steps(Trainer& t, const Batch& b, std::int64_t steps,
                                       EpochInfo* epoch = nullptr) {
  pipeline::StagedBatchSource src({b}, steps);
  Steps obs;
  REQUIRE_OK_AND_ASSIGN(auto ep, t.train_epoch(src, steps, obs));
  if (epoch) *epoch = ep;
  std::vector<double> losses;
  for (const auto& s : obs.steps) losses.push_back(s.loss);
  return losses;
}

}  // namespace segflow::testing::train
