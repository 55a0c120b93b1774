// Box-prompted inference: label maps from box masks, 3D propagation, the SAM slice
// segmenter and the run (models/inference/box_inference.hpp).
#include "models/inference/box_inference.hpp"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>

#include "models/nets/sam.hpp"
#include "models/training/amp.hpp"
#include "models/training/class_names.hpp"
#include "models/training/trainer.hpp"
#include "pipeline/io/case_files.hpp"
#include "pipeline/io/dicom.hpp"
#include "pipeline/io/dicom_seg_style.hpp"
#include "pipeline/io/image_io.hpp"
#include "pipeline/io/nifti.hpp"
#include "pipeline/pipeline_spec.hpp"
#include "pipeline/stage_registry.hpp"
#include "pipeline/transforms/medsam.hpp"

namespace segflow::models {

namespace box_infer_detail {

namespace fs = std::filesystem;
namespace F = torch::nn::functional;

/// Writes one mask's probabilities into the label map by the merge rule: a voxel takes
/// `label` when p > threshold and p beats the probability it holds.
void merge_mask(BoxLabelMap& m, std::int64_t z, std::int64_t label, const at::Tensor& p) {
  at::Tensor held = m.probability[z];
  const at::Tensor take = (p > kMaskThreshold) & (p > held);
  held.masked_scatter_(take, p.masked_select(take));
  m.labels[z].masked_fill_(take, label);
}

BoxLabelMap empty_map(const Size3& size) {
  return {torch::zeros({size[2], size[1], size[0]}, at::kLong),
          torch::zeros({size[2], size[1], size[0]}, at::kFloat)};
}

Status check_probabilities(const at::Tensor& p, std::size_t n, const Size3& size, std::int64_t z) {
  if (!p.defined() || p.dim() != 3 || p.size(0) != static_cast<std::int64_t>(n) || p.size(1) != size[1] ||
      p.size(2) != size[0])
    return internal_error(
        "slice " + std::to_string(z) + ": the segmenter returned " +
        (p.defined() ? std::to_string(p.dim()) + "-d probabilities" : std::string("nothing")) +
        ", expected (" + std::to_string(n) + ", " + std::to_string(size[1]) + ", " + std::to_string(size[0]) +
        ")");
  return Status::ok();
}

/// The box of a mask grown by `margin` voxels per side, clamped to the slice.
SliceBox grown_box(std::int64_t label, std::int64_t z, const at::Tensor& mask, std::int64_t margin,
                   const Size3& size) {
  const at::Tensor rows = mask.any(1).nonzero().flatten(), cols = mask.any(0).nonzero().flatten();
  SliceBox b;
  b.label = label;
  b.slice = z;
  b.x0 = static_cast<double>(std::max<std::int64_t>(0, cols.min().item<std::int64_t>() - margin));
  b.x1 = static_cast<double>(std::min<std::int64_t>(size[0] - 1, cols.max().item<std::int64_t>() + margin));
  b.y0 = static_cast<double>(std::max<std::int64_t>(0, rows.min().item<std::int64_t>() - margin));
  b.y1 = static_cast<double>(std::min<std::int64_t>(size[1] - 1, rows.max().item<std::int64_t>() + margin));
  return b;
}

/// One label's propagation state.
struct Track {
  SliceBox seed;
  at::Tensor up, down;  ///< the last mask going up / down; undefined once it vanished
};

/// Segments the active tracks of slice z (boxes from `boxes_of`), merges, and returns the masks.
Result<std::vector<at::Tensor>> segment_tracks(BoxLabelMap& m, std::int64_t z,
                                               const std::vector<SliceBox>& boxes, const Size3& size,
                                               const SliceSegmenter& segment) {
  SEGFLOW_ASSIGN_OR_RETURN(at::Tensor p, segment(z, boxes));
  SEGFLOW_RETURN_IF_ERROR(check_probabilities(p, boxes.size(), size, z));
  std::vector<at::Tensor> masks;
  for (std::size_t i = 0; i < boxes.size(); ++i) {
    merge_mask(m, z, boxes[i].label, p[static_cast<std::int64_t>(i)]);
    masks.push_back(p[static_cast<std::int64_t>(i)] > kMaskThreshold);
  }
  return masks;
}

/// The SAM of a checkpoint applied to the slices of one preprocessed volume, with the image
/// embedding of the last slice kept for its other boxes.
class SamSlices {
 public:
  /// `longest_side` > 0: the training resized each slice's longest side to it and padded
  /// (resize_longest_side); 0: a plain resize to the model's square (medsam_box's image_size).
  /// `amp`: none | bf16 | fp16 (resolved for the trainer's device): the encoder and decoder
  /// run under autocast, the masks are upsampled and thresholded in float32.
  SamSlices(const Trainer& trainer, at::Tensor volume, std::int64_t longest_side = 0,
            std::string amp = "none")
      : trainer_(trainer), volume_(std::move(volume)), longest_side_(longest_side), amp_(std::move(amp)) {
    sam_ = dynamic_cast<SamImpl*>(&trainer.model().module());
  }
  bool ok() const { return sam_ != nullptr; }
  std::int64_t embedded() const { return embedded_; }

  Result<at::Tensor> operator()(std::int64_t z, const std::vector<SliceBox>& boxes) {
    torch::NoGradGuard ng;
    trainer_.fit_intra_op_team();  // per slice: the team follows the machine's load
    const std::int64_t S = sam_->options.image_encoder.img_size;
    const std::int64_t H = volume_.size(2), W = volume_.size(3);
    const c10::Device dev = trainer_.device();
    if (z != cached_z_) {
      at::Tensor x = volume_.select(1, z).to(at::kFloat);  // (C, H, W)
      if (x.size(0) == 1) x = x.repeat({3, 1, 1});
      if (longest_side_ > 0) x = pipeline::resize_longest_side(x, longest_side_, false, true);
      x = x.unsqueeze(0).to(dev);
      if (longest_side_ == 0 && (H != S || W != S))
        x = F::interpolate(x, F::InterpolateFuncOptions()
                                  .size(std::vector<std::int64_t>{S, S})
                                  .mode(torch::kBilinear)
                                  .align_corners(false));
      AutocastGuard ac(dev, amp_);
      embedding_ = sam_->image_encoder->forward(x);
      cached_z_ = z;
      ++embedded_;
    }
    std::vector<float> coords;
    const double sx = static_cast<double>(S) / static_cast<double>(W),
                 sy = static_cast<double>(S) / static_cast<double>(H);
    // resize_longest_side scales the training box by one factor (size / longest side).
    const double s1 = static_cast<double>(longest_side_) / static_cast<double>(std::max(H, W));
    for (const SliceBox& b : boxes)
      for (double v : longest_side_ > 0 ? std::vector<double>{b.x0 * s1, b.y0 * s1, b.x1 * s1, b.y1 * s1}
                                        : std::vector<double>{b.x0 * sx, b.y0 * sy, (b.x1 + 1) * sx - 1,
                                                              (b.y1 + 1) * sy - 1})
        coords.push_back(static_cast<float>(v));
    const auto n = static_cast<std::int64_t>(boxes.size());
    at::Tensor bt = torch::tensor(coords).view({n, 4}).to(dev);
    at::Tensor low_res;
    {
      AutocastGuard ac(dev, amp_);
      auto [sparse, dense] = sam_->prompt_encoder->forward(bt);
      low_res = std::get<0>(
          sam_->mask_decoder->forward(embedding_, sam_->prompt_encoder->get_dense_pe(), sparse, dense));
    }
    low_res = low_res.to(at::kFloat);
    if (longest_side_ > 0) {  // LiteMedSAM: up to the padded square, the padding cut off
      low_res = F::interpolate(low_res, F::InterpolateFuncOptions()
                                            .size(std::vector<std::int64_t>{S, S})
                                            .mode(torch::kBilinear)
                                            .align_corners(false));
      const auto [nh, nw] = pipeline::longest_side_shape(H, W, longest_side_);
      low_res = low_res.narrow(2, 0, nh).narrow(3, 0, nw);
    }
    at::Tensor logits = F::interpolate(low_res, F::InterpolateFuncOptions()
                                                    .size(std::vector<std::int64_t>{H, W})
                                                    .mode(torch::kBilinear)
                                                    .align_corners(false));
    return torch::sigmoid(logits.to(at::kFloat)).squeeze(1).cpu();
  }

 private:
  const Trainer& trainer_;
  at::Tensor volume_;  ///< (C, Z, Y, X) preprocessed
  std::int64_t longest_side_ = 0;
  std::string amp_;
  SamImpl* sam_ = nullptr;
  at::Tensor embedding_;
  std::int64_t cached_z_ = -1, embedded_ = 0;
};

/// The size of a resize_longest_side stage (stages[i]) that box inference can apply per slice:
/// padded to the model's square input.
Result<std::int64_t> longest_side_of(const Trainer& trainer, const nlohmann::json& options, std::size_t i) {
  const auto* sam = dynamic_cast<const SamImpl*>(&trainer.model().module());
  const std::int64_t S = sam ? sam->options.image_encoder.img_size : 0;
  const std::int64_t size = options.value("size", std::int64_t{0});
  const std::string where =
      trainer.config().file + ": stages[" + std::to_string(i) + "] (resize_longest_side)";
  if (!options.value("pad", true))
    return unsupported(where +
                       ": pad: expected true for box-prompted inference (a square model input), got false");
  if (size != S)
    return unsupported(where + ": size: expected the model's img_size " + std::to_string(S) + ", got " +
                       std::to_string(size));
  return size;
}

/// The checkpoint's deterministic stages before medsam_box, run on the volume; they must keep
/// its grid. After medsam_box only resize_longest_side (padded, to the model's size) is taken:
/// its size goes to `longest_side` and SamSlices applies it per slice. Errors name another
/// deterministic stage after medsam_box (box inference cannot apply it).
Result<at::Tensor> preprocess(const Trainer& trainer, const pipeline::Image& input, const std::string& id,
                              std::int64_t& longest_side) {
  const JobConfig& cfg = trainer.config();
  SEGFLOW_ASSIGN_OR_RETURN(pipeline::Pipeline pipe,
                           pipeline::build_pipeline(cfg.stages, pipeline::builtin_registry(), cfg.file));
  const nlohmann::json resolved = pipe.to_json();
  std::size_t medsam = pipe.size();
  std::string image_key = "image";
  for (std::size_t i = 0; i < pipe.size(); ++i)
    if (resolved[i].value("name", "") == "medsam_box") {
      medsam = i;
      image_key = resolved[i]["options"].value("image_key", image_key);
      break;
    }
  longest_side = 0;
  for (std::size_t i = medsam + 1; i < pipe.size(); ++i) {
    if (resolved[i].value("name", "") == "resize_longest_side" && longest_side == 0) {
      SEGFLOW_ASSIGN_OR_RETURN(longest_side, longest_side_of(trainer, resolved[i]["options"], i));
      continue;
    }
    if (pipe.stages()[i]->deterministic())
      return unsupported(cfg.file + ": stages[" + std::to_string(i) + "] (" + resolved[i].value("name", "") +
                         "): box-prompted inference applies the deterministic stages before medsam_box and "
                         "resize_longest_side only; expected no other after it");
  }
  std::vector<Sample> v(1);
  v[0].id = id;
  v[0].geometry = input.geometry;
  v[0].tensors[image_key] = input.voxels.to(at::kFloat);
  v[0].tensors["label"] =
      torch::zeros({1, input.voxels.size(1), input.voxels.size(2), input.voxels.size(3)}, at::kByte);
  pipeline::Rng unused(0);
  for (std::size_t i = 0; i < medsam; ++i)
    if (pipe.stages()[i]->deterministic()) SEGFLOW_RETURN_IF_ERROR(pipe.run_range(v, unused, i, i + 1));
  if (v.size() != 1 || !v[0].has(image_key))
    return internal_error(id + ": the deterministic stages made " + std::to_string(v.size()) +
                          " samples from one");
  const at::Tensor image = v[0].at(image_key);
  if (image.dim() != 4 || image.size(1) != input.voxels.size(1) || image.size(2) != input.voxels.size(2) ||
      image.size(3) != input.voxels.size(3) || !geometry_close(v[0].geometry, input.geometry, 1e-4))
    return unsupported(cfg.file + ": the stages before medsam_box change the image's grid (" +
                       describe(input.geometry) + " -> " + describe(v[0].geometry) +
                       "); box-prompted inference expects stages that keep it");
  if (image.size(0) != 1 && image.size(0) != 3)
    return invalid_argument(id + ": the model takes 1 or 3 image channels, got " +
                            std::to_string(image.size(0)));
  return image;
}

bool is_dicom(const fs::path& p) {
  const auto f = pipeline::detect_format(p);
  return f == pipeline::ImageFormat::dicom_file || f == pipeline::ImageFormat::dicom_folder;
}

/// The output file: a folder gets "<stem>_seg.nii.gz" or "seg.dcm" (as segflow infer).
fs::path output_file(const BoxInferOptions& o, bool dicom) {
  std::error_code ec;
  if (!fs::is_directory(o.output, ec) && !o.output.string().ends_with("/")) return o.output;
  const bool seg = o.format == "seg" || (o.format.empty() && dicom);
  const std::string stem =
      pipeline::is_nifti_path(o.input) ? pipeline::image_stem(o.input) : o.input.filename().string();
  return seg ? o.output / "seg.dcm" : o.output / (stem + "_seg.nii.gz");
}

/// Checks the options and the output path before anything runs.
Status check_options(const BoxInferOptions& o, const fs::path& out, bool dicom) {
  const int sources = (o.boxes.empty() ? 0 : 1) + (o.boxes_from.empty() ? 0 : 1);
  if (sources != 1)
    return invalid_argument(sources == 0 ? "--boxes or --boxes-from: one is required for a box-prompted model"
                                         : "--boxes and --boxes-from: expected one of them, got both");
  if (o.box_margin < 0)
    return invalid_argument("--box-margin: expected an integer >= 0, got " + std::to_string(o.box_margin));
  if (!o.format.empty() && o.format != "nifti" && o.format != "seg")
    return invalid_argument("--format: expected nifti or seg, got '" + o.format + "'");
  if (!is_single_scan(o.input))
    return invalid_argument(o.input.string() +
                            ": --input: box-prompted inference takes one scan (a file or a "
                            "DICOM series folder), got a folder of scans");
  SEGFLOW_RETURN_IF_ERROR(check_also_output(o.also_output, dicom, o.input));
  if (out.extension() == ".dcm" && !dicom)
    return invalid_argument(out.string() + ": DICOM SEG output needs a DICOM input, got " + o.input.string());
  return check_label_map_path(out);
}

/// The prompts of the run: the box file's or the label map's.
Result<std::vector<SliceBox>> prompts(const BoxInferOptions& o, const pipeline::Image& input,
                                      const std::vector<std::string>& names) {
  if (!o.boxes.empty()) return read_box_file(o.boxes, input, names);
  SEGFLOW_ASSIGN_OR_RETURN(pipeline::Image lab, pipeline::read_image(o.boxes_from));
  if (lab.size() != input.size() || !geometry_close(lab.geometry, input.geometry, 1e-3))
    return invalid_argument(o.boxes_from.string() +
                            ": --boxes-from: expected a label map on the input's grid (" +
                            describe(input.geometry) + "), got " + describe(lab.geometry));
  if (at::isFloatingType(lab.voxels.scalar_type()) && !torch::equal(lab.voxels, lab.voxels.round()))
    return invalid_argument(o.boxes_from.string() + ": --boxes-from: expected integer labels, got fractions");
  std::vector<SliceBox> b =
      o.propagate ? seed_boxes_from_label_map(lab.voxels) : boxes_from_label_map(lab.voxels);
  if (b.empty())
    return invalid_argument(o.boxes_from.string() + ": --boxes-from: the label map has no label > 0");
  return b;
}

std::vector<BoxInferResult::LabelSpan> spans_of(const at::Tensor& labels, const std::vector<SliceBox>& boxes,
                                                const std::vector<std::string>& names) {
  std::map<std::int64_t, BoxInferResult::LabelSpan> by_label;
  for (const SliceBox& b : boxes) by_label[b.label].label = b.label;
  for (auto& [v, s] : by_label) {
    s.name = static_cast<std::size_t>(v) < names.size() ? names[v] : "label_" + std::to_string(v);
    const at::Tensor zs = (labels == v).flatten(1).any(1).nonzero().flatten();
    s.voxels = (labels == v).sum().item<std::int64_t>();
    if (zs.numel() > 0)
      s.first_slice = zs.min().item<std::int64_t>(), s.last_slice = zs.max().item<std::int64_t>();
  }
  std::vector<BoxInferResult::LabelSpan> out;
  for (auto& [v, s] : by_label) out.push_back(s);
  return out;
}

}  // namespace box_infer_detail

Result<BoxLabelMap> segment_boxes(const std::vector<SliceBox>& boxes, const Size3& size,
                                  const SliceSegmenter& segment) {
  using namespace box_infer_detail;
  BoxLabelMap m = empty_map(size);
  std::map<std::int64_t, std::vector<SliceBox>> by_slice;
  for (const SliceBox& b : boxes) by_slice[b.slice].push_back(b);
  for (const auto& [z, bs] : by_slice)
    SEGFLOW_RETURN_IF_ERROR(segment_tracks(m, z, bs, size, segment).status());
  return m;
}

Result<BoxLabelMap> propagate_boxes(const std::vector<SliceBox>& seeds, const Size3& size,
                                    std::int64_t margin, const SliceSegmenter& segment) {
  using namespace box_infer_detail;
  std::map<std::int64_t, Track> tracks;  // by label: ascending labels
  for (const SliceBox& s : seeds) {
    if (tracks.count(s.label))
      return invalid_argument("--propagate: label " + std::to_string(s.label) + " has seed boxes on slices " +
                              std::to_string(tracks[s.label].seed.slice) + " and " + std::to_string(s.slice) +
                              "; expected one seed box per label");
    tracks[s.label].seed = s;
  }
  BoxLabelMap m = empty_map(size);
  // Upwards from the lowest seed: a label's seed slice, then its slices above while its mask lasts.
  for (std::int64_t z = 0; z < size[2]; ++z) {
    std::vector<SliceBox> boxes;
    std::vector<Track*> active;
    for (auto& [label, t] : tracks) {
      if (t.seed.slice == z)
        boxes.push_back(t.seed);
      else if (t.seed.slice < z && t.up.defined())
        boxes.push_back(grown_box(label, z, t.up, margin, size));
      else
        continue;
      active.push_back(&t);
    }
    if (boxes.empty()) continue;
    SEGFLOW_ASSIGN_OR_RETURN(std::vector<at::Tensor> masks, segment_tracks(m, z, boxes, size, segment));
    for (std::size_t i = 0; i < active.size(); ++i) {
      const bool any = masks[i].any().item<bool>();
      active[i]->up = any ? masks[i] : at::Tensor();
      if (active[i]->seed.slice == z) active[i]->down = active[i]->up;
    }
  }
  // Downwards from the highest seed: the slices below each seed while its mask lasts.
  for (std::int64_t z = size[2] - 1; z >= 0; --z) {
    std::vector<SliceBox> boxes;
    std::vector<Track*> active;
    for (auto& [label, t] : tracks)
      if (t.seed.slice > z && t.down.defined()) {
        boxes.push_back(grown_box(label, z, t.down, margin, size));
        active.push_back(&t);
      }
    if (boxes.empty()) continue;
    SEGFLOW_ASSIGN_OR_RETURN(std::vector<at::Tensor> masks, segment_tracks(m, z, boxes, size, segment));
    for (std::size_t i = 0; i < active.size(); ++i)
      active[i]->down = masks[i].any().item<bool>() ? masks[i] : at::Tensor();
  }
  return m;
}

Result<std::unique_ptr<Trainer>> load_box_model(const std::filesystem::path& checkpoint,
                                                const std::string& device) {
  if (checkpoint.empty()) return invalid_argument("--checkpoint: required");
  SEGFLOW_ASSIGN_OR_RETURN(auto trainer, load_for_inference(checkpoint, device));
  const ModelInfo& info = trainer->model().info();
  if (!info.needs_box)
    return invalid_argument(checkpoint.string() +
                            ": --boxes/--boxes-from/--propagate: expected a box-prompted (sam) "
                            "checkpoint, got a '" +
                            info.name + "' model, which takes no boxes");
  return trainer;
}

Result<BoxInferResult> run_box_inference(const BoxInferOptions& o) {
  using namespace box_infer_detail;
  try {
    if (o.checkpoint.empty()) return invalid_argument("--checkpoint: required");
    const bool dicom = is_dicom(o.input);
    SEGFLOW_RETURN_IF_ERROR(
        box_infer_detail::check_options(o, box_infer_detail::output_file(o, dicom), dicom));
    SEGFLOW_ASSIGN_OR_RETURN(auto trainer, load_box_model(o.checkpoint, o.device));
    return run_box_inference(o, *trainer);
  } catch (const c10::Error& e) {
    return internal_error(o.input.string() + ": " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return internal_error(o.input.string() + ": " + e.what());
  }
}

Result<BoxInferResult> run_box_inference(const BoxInferOptions& o, Trainer& model) {
  using namespace box_infer_detail;
  try {
    const auto t0 = std::chrono::steady_clock::now();
    const bool dicom = is_dicom(o.input);
    const fs::path out = output_file(o, dicom);
    SEGFLOW_RETURN_IF_ERROR(check_options(o, out, dicom));
    Trainer* trainer = &model;
    const std::vector<std::string> names =
        o.class_names.empty() ? model_class_names(*trainer) : o.class_names;
    SEGFLOW_ASSIGN_OR_RETURN(pipeline::Image input, pipeline::read_image(o.input));
    SEGFLOW_ASSIGN_OR_RETURN(std::vector<SliceBox> boxes, prompts(o, input, names));
    const std::string id = pipeline::strip_channel_zero(pipeline::case_id_of(o.input));
    std::int64_t longest_side = 0;
    SEGFLOW_ASSIGN_OR_RETURN(at::Tensor volume, preprocess(*trainer, input, id, longest_side));
    trainer->model().module().eval();
    SEGFLOW_ASSIGN_OR_RETURN(
        const AmpChoice amp,
        resolve_amp(o.amp.empty() ? (trainer->device().is_cuda() ? "auto" : "none") : o.amp,
                    trainer->device()));
    SamSlices sam(*trainer, volume, longest_side, amp.mode);
    if (!sam.ok()) return internal_error(o.checkpoint.string() + ": the box-prompted model is not a SAM");
    const SliceSegmenter segment = [&sam](std::int64_t z, const std::vector<SliceBox>& b) {
      return sam(z, b);
    };
    SEGFLOW_ASSIGN_OR_RETURN(BoxLabelMap m, o.propagate
                                                ? propagate_boxes(boxes, input.size(), o.box_margin, segment)
                                                : segment_boxes(boxes, input.size(), segment));
    const std::int64_t top = m.labels.max().item<std::int64_t>();
    const at::Tensor labels = m.labels.unsqueeze(0).to(top < 256 ? at::kByte : at::kShort);
    SEGFLOW_RETURN_IF_ERROR(
        write_label_maps(out, o.also_output, input, labels, dicom ? o.input : fs::path(), names));
    BoxInferResult r;
    r.result.output = out;
    r.result.also_written = o.also_output;
    r.result.size = input.size();
    r.result.case_id = id;
    const at::Tensor u = std::get<0>(at::_unique(m.labels.flatten(), true));
    for (std::int64_t i = 0; i < u.numel(); ++i) r.result.labels.push_back(u[i].item<std::int64_t>());
    r.spans = spans_of(m.labels, boxes, names);
    r.slices_embedded = sam.embedded();
    r.result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  } catch (const c10::Error& e) {
    return internal_error(o.input.string() + ": " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return internal_error(o.input.string() + ": " + e.what());
  }
}

}  // namespace segflow::models
