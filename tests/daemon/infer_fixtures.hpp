#pragma once
// Fixtures of the daemon's inference tests: checkpoints for the box-prompted tests (an
// untrained tiny SAM, img 32, made in a second, or the tiny UNet of JobYaml, saved without
// training) and files dropped into a watched folder as a transfer tool would.

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <filesystem>

#include "job_yaml.hpp"
#include "models/training/job_config.hpp"
#include "models/training/trainer.hpp"
#include "test_util.hpp"

namespace segflow::testing::daemon {

/// An untrained tiny SAM (`sam`: img 32, 2 classes) or the tiny UNet of JobYaml on the
/// dataset `data`, saved as `file` (its runs folder beside it).
inline std::filesystem::path daemon_box_checkpoint(const std::filesystem::path& data,
                                                   const std::filesystem::path& file, bool sam) {
  JobYaml job;
  job.root = data;
  job.runs_dir = file.parent_path() / "runs";
  if (sam) {
    job.num_classes = "2";
    job.stages = {kLoadStage, kCtWindowStage, stage("medsam_box", "{image_size: 32, num_samples: 2}")};
    job.model =
        "{name: sam, preset: tiny, img_size: 32, patch_size: 4, embed_dim: 32, depth: 1, num_heads: 2, "
        "spatial_dims: 2, in_channels: 3, out_channels: 1}";
    job.loss = "{name: dice_bce, sigmoid: true, to_onehot_y: false}";
    job.validation = "";
  }
  REQUIRE_OK_AND_ASSIGN(auto cfg, segflow::models::parse_job_config(job.yaml(), "job.yaml"));
  torch::manual_seed(3);
  REQUIRE_OK_AND_ASSIGN(auto t, segflow::models::Trainer::create(cfg, c10::Device("cpu")));
  REQUIRE_OK(t->save_checkpoint(file));
  return file;
}

/// Copies `from` (or writes `text` when `from` is empty) to `to` through the file `aside`
/// outside the watched folder and a rename, as a transfer tool would (the watcher sees one
/// complete file appear).
inline void drop_file(const std::filesystem::path& aside, const std::filesystem::path& from_or_empty,
                      const std::string& text, const std::filesystem::path& to) {
  if (from_or_empty.empty())
    write_file(aside, text);
  else
    std::filesystem::copy_file(from_or_empty, aside, std::filesystem::copy_options::overwrite_existing);
  std::filesystem::rename(aside, to);
}

}  // namespace segflow::testing::daemon
