#pragma once
// The one builder of the job configs the suites write: JobYaml starts as the tiny 3D job the
// apps, daemon and parallel suites train (epochs take a second or two on a CPU) and a test
// sets only what differs. Every field holds the YAML of its key's value in flow style (a
// stage list entry, a model mapping); an empty field leaves its key out, so a job without a
// data section or a schedule is spelled as such.
//
//   JobYaml job;                       // the tiny job, data under `root`
//   job.root = dir / "data";
//   job.epochs = 2;
//   job.runs_dir = dir / "runs";
//   parse_job_config(job.yaml(), "job.yaml");
//
// Header-only and free of the libraries: a test of the builder itself needs nothing else.

#include <filesystem>
#include <string>
#include <vector>

namespace segflow::testing {

/// A stage list entry `{name: NAME}`, or `{name: NAME, options: OPTIONS}` (OPTIONS a flow map).
inline std::string stage(const std::string& name, const std::string& options = "") {
  return "{name: " + name + (options.empty() ? "" : ", options: " + options) + "}";
}

/// The stages most jobs share.
inline const std::string kLoadStage = stage("load");
inline const std::string kFgBgStage = stage("fg_bg_indices");
/// A CT window [-200, 300] HU scaled to [0, 1].
inline const std::string kCtWindowStage =
    stage("scale_intensity_range", "{a_min: -200, a_max: 300, b_min: 0.0, b_max: 1.0, clip: true}");
/// Resampling to 2.5 x 2.5 x 3 mm.
inline const std::string kResampleStage = stage("resample", "{spacing: [2.5, 2.5, 3.0]}");
/// A flip along x with probability 0.5.
inline const std::string kFlipXStage = stage("rand_flip", "{prob: 0.5, spatial_axis: [0]}");

/// Random crops of `size` (e.g. "[16, 16, 16]"), `pos` foreground- to `neg` background-centred,
/// `num_samples` per case.
inline std::string crop_stage(const std::string& size, int pos, int neg, int num_samples) {
  return stage("rand_crop_pos_neg", "{spatial_size: " + size + ", pos: " + std::to_string(pos) +
                                        ", neg: " + std::to_string(neg) +
                                        ", num_samples: " + std::to_string(num_samples) + "}");
}

/// A 3D UNet on one input channel with `out_channels` classes and `rest` of its options
/// ("channels: [4, 8], strides: [2], num_res_units: 1").
inline std::string unet3d(int out_channels, const std::string& rest) {
  return "{name: unet, spatial_dims: 3, in_channels: 1, out_channels: " + std::to_string(out_channels) +
         ", " + rest + "}";
}

/// A job config, section by section; the defaults are the tiny 3D job: 5 synthetic 24^3
/// NIfTI cases under `root`, resampled to 2.5 x 2.5 x 3 mm, a CT window to [0, 1], 16^3
/// pos/neg crops x 2, a flip; a 3D UNet of 4-8-16 channels, DiceCE, Adam 0.01, 4 epochs of
/// batch 2 on the CPU, validation on 16^3 windows.
struct JobYaml {
  std::string name = "tiny";
  std::string seed = "3";
  // data: written when `root` is set (and `root` first).
  std::filesystem::path root;
  std::string synth = "{cases: 5, size: 24, format: nifti, seed: 9}";
  std::string val_cases = "1";
  std::string folds;
  std::string num_classes = "5";
  /// Stage list entries in order (flow style: "{name: load}", or a bare "load").
  std::vector<std::string> stages = {
      kLoadStage, kResampleStage, kCtWindowStage, kFgBgStage, crop_stage("[16, 16, 16]", 1, 1, 2),
      kFlipXStage};
  std::string model =
      unet3d(5, "channels: [4, 8, 16], strides: [2, 2], num_res_units: 1, norm: batch, dropout: 0.1");
  std::string loss = "{name: dice_ce, to_onehot_y: true, softmax: true}";
  std::string optimizer = "{name: adam, lr: 0.01}";
  std::string schedule = "{name: constant}";
  /// train.epochs; below 0: not written.
  int epochs = 4;
  /// The rest of the `train` mapping; suites append to it (e.g. ", log_every: 1").
  std::string train =
      "batch_size: 2, device: cpu, val_interval: 2, checkpoint_interval: 1, loader: simple, threads: 1";
  std::string validation = "{roi_size: [16, 16, 16], overlap: 0.25, sw_batch_size: 2}";
  /// output.runs_dir; empty: no output section.
  std::filesystem::path runs_dir;
  /// Lines appended as they are (a section the fields above do not cover).
  std::string extra;

  /// The config as YAML text.
  std::string yaml() const {
    std::string y;
    auto line = [&](const std::string& key, const std::string& value) {
      if (!value.empty()) y += key + ": " + value + "\n";
    };
    line("name", name);
    line("seed", seed);
    if (!root.empty()) {
      y += "data:\n  root: " + root.string() + "\n";
      line("  synth", synth);
      line("  val_cases", val_cases);
      line("  folds", folds);
      line("  num_classes", num_classes);
    }
    if (!stages.empty()) {
      y += "stages:\n";
      for (const auto& s : stages) y += "  - " + s + "\n";
    }
    line("model", model);
    line("loss", loss);
    line("optimizer", optimizer);
    line("schedule", schedule);
    const std::string epochs_item = epochs >= 0 ? "epochs: " + std::to_string(epochs) : "";
    if (!epochs_item.empty() || !train.empty())
      y += "train: {" + epochs_item + (!epochs_item.empty() && !train.empty() ? ", " : "") + train + "}\n";
    line("validation", validation);
    if (!runs_dir.empty()) y += "output: {runs_dir: " + runs_dir.string() + "}\n";
    return y + extra;
  }
};

}  // namespace segflow::testing
