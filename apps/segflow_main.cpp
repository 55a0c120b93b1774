// segflow: the command line. Parses arguments and calls the libraries (or starts actors).
#include <nlohmann/json.hpp>

#include <cstdio>
#include <functional>
#include <iostream>
#include <map>

#include "apps/commands.hpp"

namespace {

using namespace segflow::apps;

constexpr const char* kUsage = R"(segflow — fast medical-image segmentation training

usage: segflow COMMAND [options]

commands:
  synth    --out DIR [--cases N] [--size S] [--format dicom|nifti|npy]
           [--compress none|rle|jpeg-ls|jpeg-lossless] [--seed K]
           [--spacing X,Y,Z [--spacing-jitter F]]
                         write a synthetic CT-like dataset with label maps
  inspect  PATH [--json] geometry and value summary of a file, series, case or dataset
  stages   [--json] [--plugins DIR]
                         every pipeline stage with its options and defaults
  plan     DATASET [--out DIR] [--device cpu|cuda:N] [--memory-gb G] [--max-step-s S]
           [--configurations 2d,3d_fullres,3d_lowres] [--memory-model measured|nnunet] [--json]
                         fingerprint the dataset and write nnU-Net-style plans: plans.json and one
                         runnable job YAML per configuration (default DIR: DATASET/.segflow-plans)
  train    CONFIG [--set key=value ...] [--resume PATH] [--plugins DIR] [--quiet]
           [--ranks N] [--devices cuda:0,cuda:1] [--fold K ... | --fold all]
                         train in the foreground; writes a run folder under runs/
                         (data parallel with --ranks/--devices, or under torchrun/srun;
                         --fold: cross-validation folds of data.folds, one run each)
  train    DATASET [--configuration 3d_fullres] [--plans DIR] [plan flags] [train flags]
                         plan the dataset (or reuse a plan whose fingerprint matches) and train
  ctl      COMMAND ...    talk to segflowd (start, stop, pause, resume, status, list, ...)
  infer    --checkpoint PATH [--checkpoint PATH2 ...] --input SCAN|DIR|DATASET
           --output out.nii.gz|seg.dcm|DIR [--tta none|mirror|mirror-all] [--save-probabilities]
           [--format nifti|seg] [--class-names bg,liver,...] [--device D] [--quiet]
           [--amp auto|none|bf16|fp16] [--channels-last on|off] [--overlap F] [--stitch-device cpu]
           [--postprocess postprocessing.json|none]
                         sliding-window inference (an ensemble with several checkpoints);
                         label maps in each input's geometry, one per case into DIR
  infer    --model MODEL_DIR --input ... --output ... [--no-postprocess] [infer flags]
                         a package's members as an ensemble, with its TTA and postprocessing
  eval     --pred P --gt G [--tolerance-mm T] [--classes 1,2,...] [--json] [--csv FILE]
                         Dice, IoU, HD95, ASSD, surface Dice and volumes per case and class
                         (files, or folders / datasets matched by case id)
  cv       RUN... [--out DIR] [--json] [--bootstrap N] [--confidence 0.95] [--seed S]
                         the folds' out-of-fold scores pooled: per class Dice, HD95, NSD with
                         bootstrap intervals, and a row per case
  postprocess determine RUN... [--out postprocessing.json] [--metric dice|iou|nsd]
           [--min-voxels 10,50,100,500,1000|none]
                         on the folds' out-of-fold predictions, keep each of: largest component
                         of all foreground, per class largest component, per class removal of
                         small components, only if it raises the metric (nnU-Net's rule)
  postprocess apply --plan postprocessing.json --input PRED|DIR --output OUT|DIR
                         apply a postprocessing.json to label maps
  package  --out MODEL_DIR (RUN... | --cv cv_summary.json ... | --selection selection.json)
           [--postprocessing postprocessing.json] [--checkpoint last|best] [--tta none|mirror]
                         the chosen checkpoints, class names, TTA, postprocessing and CV figures
                         in one folder with a manifest and sha256s (infer --model takes it)
  select   CV_SUMMARY.json... [--metric dice|hd95|nsd] [--class N|mean] [--max-ensemble K]
           [--out selection.json] [--json] [--bootstrap N] [--confidence 0.95] [--seed S]
                         rank configurations (one cv summary each) and every ensemble of 2..K
                         of them on the same out-of-fold cases; the winner, and whether the
                         runner-up is within its confidence interval
  export   --checkpoint best.pt --to pytorch OUT.pt
                         the trained network as a PyTorch state dict for MONAI's UNet,
                         nnU-Net's PlainConvUNet or segment_anything's Sam, and OUT.json
  export   --checkpoint best.pt | --model MODEL_DIR --to onnx OUT [--opset N] [--fp16-weights]
                         a unet / plain_unet as checked ONNX with OUT.manifest.json (its
                         preprocessing, sliding window and classes)
  export   --checkpoint best.pt --to nnunet RESULTS_DIR [--fold K] [--spacing X,Y,Z]
                         a 3D plain_unet as an nnU-Net v2 results folder its predictor runs
  import   --from nnunet RESULTS_DIR/fold_K --out DIR
                         nnU-Net weights and plans as a segflow job, checkpoint and weights
  import   --from monai MODEL.pt|BUNDLE_DIR --out DIR [--layout monai|segflow]
           [--spatial-dims 3 --in-channels 1 --out-channels 2 --channels 16,32,.. --strides 2,2,..
           --num-res-units N --norm batch|instance ...]
                         MONAI UNet weights (a bundle, or a state dict and its arguments) the same way
  bench    CONFIG [--json] [--seconds S] [--epochs N] [--loaders actors,simple] [--set k=v ...]
                         samples/s of the real data path + trainer vs the compute step alone
  help                   this text

Every command exits non-zero with one line on stderr for bad input.
)";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string cmd = argv[1];
  static const std::map<std::string, std::function<int(int, char**)>> commands = {
      {"synth", cmd_synth},     {"inspect", cmd_inspect}, {"stages", cmd_stages},
      {"train", cmd_train},     {"infer", cmd_infer},     {"ctl", cmd_ctl},
      {"bench", cmd_bench},     {"eval", cmd_eval},       {"export", cmd_export},
      {"plan", cmd_plan},       {"cv", cmd_cv},           {"postprocess", cmd_postprocess},
      {"package", cmd_package}, {"select", cmd_select},   {"import", cmd_import},
  };
  if (cmd == "help" || cmd == "--help" || cmd == "-h") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  auto it = commands.find(cmd);
  if (it == commands.end()) {
    std::fprintf(stderr, "segflow: unknown command '%s' (run 'segflow help')\n", cmd.c_str());
    return 2;
  }
  try {
    return it->second(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "segflow %s: internal error: %s\n", cmd.c_str(), e.what());
    return 1;
  }
}
