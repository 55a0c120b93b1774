#pragma once
// `segflow infer`: trained checkpoints applied to scans; label maps (and, on request, class
// probabilities) come back in each input's own geometry (NIfTI, or DICOM SEG for DICOM
// input). One scan, a folder of scans or a dataset; mirroring test-time augmentation;
// ensembles of checkpoints averaged as probabilities.
//
// How a case is predicted: each checkpoint runs the deterministic stages of its own
// training pipeline, then sliding-window inference whose windows are turned into
// probabilities (softmax; sigmoid as [1 - p, p] for one-channel models) before blending,
// optionally averaged over every combination of flips of the window's spatial axes
// (nnU-Net's mirroring: the axes the training flipped, or all of them). The checkpoints' probabilities are
// averaged on the first one's preprocessed grid; the label map is their argmax, mapped back to the input's
// grid (nearest, through patient coordinates); saved probabilities are mapped back linearly.

#include <ATen/core/Tensor.h>
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "messages/geometry.hpp"
#include "messages/status.hpp"
#include "models/fwd.hpp"
#include "models/inference/tta.hpp"
#include "pipeline/fwd.hpp"

namespace segflow::models {

/// One case of a folder or dataset: its image channels.
struct InferCase {
  std::string id;
  std::vector<std::filesystem::path> channels;  ///< one file or DICOM series folder per channel
  bool dicom = false;                           ///< a DICOM series (DICOM SEG output by default)
};

/// Options of one inference run.
struct InferOptions {
  std::filesystem::path checkpoint;  ///< best.pt / last.pt of a run (the first of an ensemble)
  /// A model package folder (`segflow package`, models/inference/model_package.hpp). When set, its
  /// members are the ensemble and its TTA, overlap, class names and postprocessing apply;
  /// `checkpoint` and `ensemble` must be empty. Every file's sha256 is checked first.
  std::filesystem::path model;
  /// With `model`: apply the package's postprocessing.json to each label map (false:
  /// `--no-postprocess`).
  bool postprocess = true;
  /// Without `model`: a postprocessing.json (`segflow postprocess determine`) applied to each
  /// label map before it is written (NIfTI and SEG alike); "" = none.
  std::filesystem::path postprocess_file;
  /// A NIfTI / npy / DICOM file or a folder with one DICOM series (run_inference); for
  /// run_inference_batch also a folder of scans or a dataset (see list_inference_cases).
  std::filesystem::path input;
  std::filesystem::path output;  ///< out.nii[.gz], out.dcm (DICOM SEG) or a folder
  /// One scan: more label-map files written from the same prediction (a NIfTI beside a SEG,
  /// say): the model runs once, each file's ending picks its format (check_label_map_path).
  std::vector<std::filesystem::path> also_output;
  std::string device = "auto";
  /// More checkpoints: an ensemble whose probabilities are averaged with `checkpoint`'s.
  /// Every member must predict the same classes from the same channels; the model families
  /// may differ (unet, plain_unet; 2D and 3D): each member runs its own stages and window.
  std::vector<std::filesystem::path> ensemble;
  TtaMode tta = TtaMode::none;
  /// Also write the class probabilities, (x, y, z, class) float32 NIfTI, next to the label
  /// map: "<label map name without extension>_probabilities.nii.gz".
  bool save_probabilities = false;
  /// Names of label values 0..K-1 (DICOM SEG segment labels). Empty: the training's class
  /// names (job_class_names of the first checkpoint's config: dataset.json `labels`, or the
  /// SEG segment labels of a DICOM dataset, carried through its map_labels stages, or their
  /// `names`); "label_<v>" where none is known.
  std::vector<std::string> class_names;
  /// Format of the files a folder output gets: "" (DICOM SEG for DICOM input, else NIfTI),
  /// "nifti" or "seg".
  std::string format;
  /// Mixed precision of the forward passes: none | bf16 | fp16 | auto (models/training/amp.hpp);
  /// "" = auto on a CUDA device, none (float32) on the CPU.
  std::string amp;
  /// Channels-last weights and inputs (faster 3D convolutions on GPUs); unset = on CUDA only.
  std::optional<bool> channels_last;
  /// Sliding-window overlap in [0, 1); < 0 = the run's validation.overlap.
  double overlap = -1.0;
  /// Window placement and weights: "" = the run's validation.mode; gaussian | constant |
  /// nnunet (nnU-Net's predictor: its layout and Gaussian, logits averaged before the softmax).
  std::string blend;
  /// Where the windows are stitched: "" = the model's device; "cpu" = host memory, for
  /// volumes whose class maps do not fit the device.
  std::string stitch_device;
  /// run_inference_batch: these cases instead of the scans listed under `input` (a run's
  /// validation cases, written as NIfTI unless `format` says otherwise).
  std::vector<InferCase> cases;
};

/// What was written for one case.
struct InferResult {
  std::filesystem::path output;
  Size3 size{0, 0, 0};               ///< of the written label map (= input size)
  std::vector<std::int64_t> labels;  ///< distinct values written
  double seconds = 0.0;
  std::string case_id;                              ///< case id (batch) or the input's name
  std::filesystem::path probabilities;              ///< the probabilities file, when saved
  std::vector<int> tta_axes;                        ///< axes mirrored (of the first checkpoint; 0 = x)
  std::vector<std::filesystem::path> also_written;  ///< InferOptions::also_output, as written
};

/// Whether `out` names a label-map file segflow writes: ".dcm" (DICOM SEG) or an ending of a
/// format of the image-format table with a writer (NIfTI, NRRD, MetaImage); the error names
/// `flag` and lists them.
Status check_label_map_path(const std::filesystem::path& out, std::string_view flag = "--output");

/// InferOptions::also_output checked before anything runs: each a label-map file segflow
/// writes (check_label_map_path), a ".dcm" only for a DICOM `input`.
Status check_also_output(const std::vector<std::filesystem::path>& files, bool dicom_input,
                         const std::filesystem::path& input);

/// Writes `labels` on `input`'s grid to `out`: a DICOM SEG for ".dcm" (referencing the series
/// read from `dicom_source`, a segment per value named from `names`), else the format table's
/// writer for the file's ending. The one label-map writer of inference and box inference.
Status write_label_map(const std::filesystem::path& out, const pipeline::Image& input,
                       const at::Tensor& labels, const std::filesystem::path& dicom_source,
                       const std::vector<std::string>& names);

/// Writes one prediction to `out` and to each of `more` (write_label_map per file): label-map
/// files first, DICOM SEGs last. Every file is tried; the first error is returned, so a SEG
/// refused for holding no foreground (ErrorCode::no_foreground) leaves the NIfTI written.
/// A ".dcm" with no `dicom_source` is refused before anything is written.
Status write_label_maps(const std::filesystem::path& out, const std::vector<std::filesystem::path>& more,
                        const pipeline::Image& input, const at::Tensor& labels,
                        const std::filesystem::path& dicom_source, const std::vector<std::string>& names);

/// Runs inference on one scan. A folder output gets "<input name>_seg.nii.gz" (NIfTI input)
/// or "seg.dcm" (DICOM input).
Result<InferResult> run_inference(const InferOptions& options);

/// The scans under `input`: a file or a DICOM series folder (one case); a dataset root
/// (its imagesTs/, else imagesTr/, else imgs/); or a folder of scans: image files (NIfTI,
/// npy, and what else read_image reads) and DICOM case folders. When every file name ends
/// in a 4-digit channel suffix (nnU-Net's "case_0000.nii.gz") files are grouped by case
/// into channels; else each file is a case. Files that are no case (dataset.json, reports,
/// saved probabilities) are left out; cases with a gap in their channels go to `skipped`.
Result<std::vector<InferCase>> list_inference_cases(
    const std::filesystem::path& input, std::vector<std::pair<std::string, std::string>>* skipped = nullptr);

/// True when `input` is one scan: a file, or a folder holding a DICOM image series.
bool is_single_scan(const std::filesystem::path& input);

/// Progress of a batch, reported before and after each case.
struct InferProgress {
  std::size_t index = 0;  ///< 0-based
  std::size_t total = 0;
  std::string case_id;
  bool done = false;     ///< false: starting; true: finished (see error)
  double seconds = 0.0;  ///< of this case, when done
  std::string error;     ///< when the case failed
  std::filesystem::path output;
};

/// What a batch wrote, and what it could not do.
struct InferBatchResult {
  std::vector<InferResult> outputs;
  std::vector<std::pair<std::string, std::string>> failed;   ///< (case id, error)
  std::vector<std::pair<std::string, std::string>> skipped;  ///< (path, reason) from the listing
  double seconds = 0.0;
};

/// Runs inference on every case of list_inference_cases(options.input) into the folder
/// options.output (created): "<case id>.nii.gz" or "<case id>.dcm". A case that fails is
/// reported (progress and `failed`) and the others go on. The models are loaded once.
/// `also_output` is refused (it names files of one scan).
Result<InferBatchResult> run_inference_batch(const InferOptions& options,
                                             const std::function<void(const InferProgress&)>& progress = {});

/// Class probabilities (K, *spatial) float32 on the CPU of one model for one preprocessed
/// image (C, *spatial): sliding windows with the run's validation settings, softmax per
/// window (or [1 - sigmoid, sigmoid]), averaged over the 2^n flips of `mirror_axes` (0 = x,
/// 1 = y, 2 = z; empty: no TTA). A 2D model on a volume runs slice by slice (z is not
/// mirrored). The model is put in eval mode. Inputs follow the weights' layout (channels
/// last when the trainer's config says so).
/// How predict_probabilities runs the model; the defaults are the run's own validation.
struct PredictOptions {
  std::string amp = "none";   ///< resolved mode: none | bf16 | fp16 (autocast around the model)
  double overlap = -1.0;      ///< < 0: the run's validation.overlap
  std::string stitch_device;  ///< "" = the model's device, "cpu" = host memory
  std::string blend;          ///< "" = the run's validation.mode; gaussian | constant | nnunet
};
at::Tensor predict_probabilities(const Trainer& trainer, const at::Tensor& image,
                                 const std::vector<int>& mirror_axes = {},
                                 const PredictOptions& options = {});

/// The labels of predict_probabilities(...).argmax(0, true), equal voxel for voxel:
/// (1, *spatial) uint8 (int16 beyond 256 classes) on the CPU. A 3D model's windows are
/// stitched slab by slab (sliding_window_labels): one window depth of the class maps is held,
/// not the whole volume's, which is what `segflow infer` runs for one model whose
/// probabilities are not saved.
at::Tensor predict_labels(const Trainer& trainer, const at::Tensor& image,
                          const std::vector<int>& mirror_axes = {}, const PredictOptions& options = {});

/// `base` with a model package's members as checkpoint + ensemble, its TTA, its overlap
/// (unless base.overlap >= 0) and its class names (unless base names some); `model` cleared.
InferOptions package_infer_options(const ModelPackage& package, const InferOptions& base);

}  // namespace segflow::models
