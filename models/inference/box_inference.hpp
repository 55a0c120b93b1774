#pragma once
// Box-prompted inference (`segflow infer --boxes / --boxes-from / --propagate`): a SAM-style
// checkpoint (ModelInfo::needs_box) segments a volume slice by slice from box prompts.
//
// Boxes come from a JSON or CSV file (voxel or patient coordinates, see read_box_file and
// docs/how-to/box-prompted.md), from a label map (the box of each label on each slice, as
// MedSAM evaluates), or seed a 3D propagation (one box per label: the seed slice is
// segmented, then each neighbouring slice with the box of the previous slice's mask grown by
// a margin, up and down until the mask vanishes, as LiteMedSAM's 3D inference does).
//
// Per slice: the checkpoint's deterministic stages before medsam_box run once on the volume
// (they must keep its grid); the slice is repeated to three channels and resized to the
// model's img_size as medsam_box does (bilinear, align_corners false); the image embedding is
// computed once and reused for every box on the slice. A voxel box [x0, x1] (inclusive
// indices of W columns) becomes [x0 S / W, (x1 + 1) S / W - 1] in the S x S frame (the extent
// of the nearest-resized mask, as medsam_box computes its boxes; the same on y). The
// decoder's low-resolution logits are upsampled bilinearly to the slice's rows and columns,
// then sigmoid; a voxel is in a box's mask when p > 0.5. Several masks on a voxel: the label
// with the highest probability wins; on a tie the one written first keeps it (box file order;
// ascending labels for label maps and propagation).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "messages/geometry.hpp"
#include "messages/status.hpp"
#include "models/inference/inference.hpp"

namespace segflow::pipeline {
struct Image;
}

namespace segflow::models {

/// Default of --box-margin: voxels added on each side of the previous slice's mask box.
inline constexpr std::int64_t kDefaultBoxMargin = 3;
/// A voxel is in a box's mask when its probability exceeds this.
inline constexpr double kMaskThreshold = 0.5;

/// One box prompt on the input's grid: inclusive voxel indices (x = column, y = row) of a
/// label's box on slice z.
struct SliceBox {
  std::int64_t label = 1;
  std::int64_t slice = 0;
  double x0 = 0, y0 = 0, x1 = 0, y1 = 0;
};

/// Options of one box-prompted run (one scan).
struct BoxInferOptions {
  std::filesystem::path checkpoint;                ///< a box-prompted (sam) checkpoint
  std::filesystem::path input;                     ///< one scan: NIfTI / npy / DICOM file or series folder
  std::filesystem::path output;                    ///< out.nii[.gz], out.dcm (DICOM SEG) or a folder
  std::vector<std::filesystem::path> also_output;  ///< more label-map files of the same prediction
  std::string device = "auto";
  std::filesystem::path boxes;                  ///< --boxes: JSON or CSV box file
  std::filesystem::path boxes_from;             ///< --boxes-from: a label map on the input's grid
  bool propagate = false;                       ///< --propagate: one seed box per label, propagated in z
  std::int64_t box_margin = kDefaultBoxMargin;  ///< --box-margin, voxels, >= 0
  std::vector<std::string> class_names;         ///< names of label values 0..K-1; "" = the training's
  std::string format;                           ///< folder output: "" (SEG for DICOM input), nifti, seg
  /// Mixed precision of the encoder and decoder: none | bf16 | fp16 | auto (models/training/amp.hpp);
  /// "" = auto on a CUDA device, none (float32) on the CPU, as `segflow infer`.
  std::string amp;
};

/// What a run wrote, and per label the slices that got a mask.
struct BoxInferResult {
  InferResult result;
  struct LabelSpan {
    std::int64_t label = 0;
    std::string name;
    std::int64_t first_slice = -1, last_slice = -1;  ///< -1: no voxel
    std::int64_t voxels = 0;
  };
  std::vector<LabelSpan> spans;
  std::int64_t slices_embedded = 0;  ///< image-encoder passes
};

/// Reads a box file (.json or .csv) for `image`'s grid. Labels are integers >= 1 or names of
/// `names` (index = value); with `names` non-empty an integer must be below names.size().
/// Errors name the file, the entry and field, and what was expected.
Result<std::vector<SliceBox>> read_box_file(const std::filesystem::path& file, const pipeline::Image& image,
                                            const std::vector<std::string>& names);

/// The prompt file of case `id` in folder `dir` (a folder run of `segflow infer --boxes DIR` /
/// `--boxes-from DIR`, and auto_infer's boxes_dir): with `box_file` the box file whose name
/// is `<id>.json` or `<id>.csv`, else the label map whose case id (channel suffix stripped)
/// is `id`. "" when there is none (or `dir` cannot be read).
std::filesystem::path prompt_file_for(const std::filesystem::path& dir, const std::string& id, bool box_file);

/// The box of every label on every slice of a label map (1, Z, Y, X): ascending label, then
/// slice.
std::vector<SliceBox> boxes_from_label_map(const at::Tensor& labels);

/// One seed per label of a label map: its box on the middle slice of the label's z range
/// (the lower middle for an even count).
std::vector<SliceBox> seed_boxes_from_label_map(const at::Tensor& labels);

/// Probabilities (N, Y, X) float on the CPU of the masks of `boxes` (all on slice z).
using SliceSegmenter = std::function<Result<at::Tensor>(std::int64_t z, const std::vector<SliceBox>& boxes)>;

/// A label map built from box masks, with the probability of each voxel's label.
struct BoxLabelMap {
  at::Tensor labels;       ///< (Z, Y, X) int64
  at::Tensor probability;  ///< (Z, Y, X) float, 0 where unlabelled
};

/// Segments every box (grouped by slice, one segmenter call per slice) into a label map of
/// `size` (x, y, z) by the merge rule of the header comment.
Result<BoxLabelMap> segment_boxes(const std::vector<SliceBox>& boxes, const Size3& size,
                                  const SliceSegmenter& segment);

/// 3D propagation from one seed box per label (see the header comment): the masks of
/// neighbouring slices are prompted with the previous slice's mask box grown by `margin`
/// voxels per side (clamped to the slice); a label stops in a direction at the first slice
/// where its mask is empty. Errors for two seeds of one label.
Result<BoxLabelMap> propagate_boxes(const std::vector<SliceBox>& seeds, const Size3& size,
                                    std::int64_t margin, const SliceSegmenter& segment);

/// Loads a box-prompted checkpoint for inference on `device`; errors for a model that takes
/// no boxes.
Result<std::unique_ptr<Trainer>> load_box_model(const std::filesystem::path& checkpoint,
                                                const std::string& device);

/// Runs box-prompted inference on one scan and writes the label map (NIfTI or DICOM SEG).
/// Everything is checked before anything is written.
Result<BoxInferResult> run_box_inference(const BoxInferOptions& options);

/// The same with `model` loaded once by load_box_model (a folder of scans); options.checkpoint
/// and options.device are not read again.
Result<BoxInferResult> run_box_inference(const BoxInferOptions& options, Trainer& model);

}  // namespace segflow::models
