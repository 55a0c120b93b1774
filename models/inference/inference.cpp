#include "models/inference/inference.hpp"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include "models/inference/model_package.hpp"
#include "models/inference/postprocessing_plan.hpp"
#include "models/training/amp.hpp"
#include "models/training/class_names.hpp"
#include "models/training/sliding_window.hpp"
#include "models/training/trainer.hpp"
#include "pipeline/io/case_files.hpp"
#include "pipeline/io/dataset.hpp"
#include "pipeline/io/dicom.hpp"
#include "pipeline/io/dicom_seg_style.hpp"
#include "pipeline/io/image_formats.hpp"
#include "pipeline/io/image_io.hpp"
#include "pipeline/io/nifti.hpp"
#include "pipeline/pipeline_spec.hpp"
#include "pipeline/stage_registry.hpp"
#include "pipeline/transforms/spatial.hpp"

namespace segflow::models {

namespace fs = std::filesystem;

namespace {

/// The sliding windows of one model over one preprocessed image: the class probabilities
/// (predict_probabilities), or with `labels` their argmax, streamed (predict_labels).
at::Tensor run_windows(const Trainer& trainer, const at::Tensor& image, const std::vector<int>& mirror_axes,
                       const PredictOptions& po, bool labels) {
  torch::NoGradGuard ng;
  const ModelHandle& model = trainer.model();
  const ModelInfo& info = model.info();
  const JobConfig& cfg = trainer.config();
  model.module().eval();
  at::Tensor x = image.to(trainer.device(), at::kFloat).unsqueeze(0);  // (1, C, *spatial)
  SlidingWindowOptions sw;
  sw.overlap = po.overlap >= 0 ? po.overlap : cfg.validation.overlap;
  sw.stitch_device = po.stitch_device;
  sw.sw_batch_size = cfg.validation.sw_batch_size;
  sw.mode = blend_mode(po.blend.empty() ? cfg.validation.mode : po.blend);
  // nnU-Net blends logits (windows and mirrors) and applies the softmax once, after.
  const bool blend_logits = sw.mode == BlendMode::nnunet;
  const auto activation = [](const at::Tensor& logits) {
    if (logits.size(1) == 1) {
      at::Tensor p = torch::sigmoid(logits);
      return torch::cat({1.0 - p, p}, 1);
    }
    return torch::softmax(logits, 1);
  };
  if (blend_logits) sw.finish = activation;
  // Config sizes are (x, y, z); tensors are (Z, Y, X). No roi_size: the whole volume.
  std::vector<std::int64_t> roi(cfg.validation.roi_size.rbegin(), cfg.validation.roi_size.rend());
  const int nd = info.spatial_dims;
  const bool channels_last = cfg.train.channels_last;
  const auto probabilities_of = [&](const at::Tensor& w) {
    at::Tensor logits;
    {
      AutocastGuard ac(trainer.device(), po.amp);
      logits = model.predict(
          channels_last && w.dim() >= 4
              ? w.contiguous(w.dim() == 5 ? at::MemoryFormat::ChannelsLast3d : at::MemoryFormat::ChannelsLast)
              : w);
    }
    logits = logits.to(at::kFloat);
    return blend_logits ? logits : activation(logits);
  };
  // Window dims of the mirrored axes: windows are (B, C, *spatial), spatial in (z,) y, x order.
  std::vector<std::int64_t> dims;
  for (int a : mirror_axes)
    if (a >= 0 && a < nd) dims.push_back(2 + (nd - 1 - a));
  const Predictor predictor = [&](const at::Tensor& w) -> at::Tensor {
    trainer.fit_intra_op_team();  // between window batches: the team follows the machine's load
    return mirror_averaged(probabilities_of, w, dims);
  };
  if (nd == 2 && x.dim() == 5) {
    // A 2D model on a volume: slices as a batch, (Z, C, Y, X).
    at::Tensor slices = x[0].permute({1, 0, 2, 3}).contiguous();
    if (roi.size() == 3) roi = {roi[1], roi[2]};
    sw.roi_size = roi.empty() ? std::vector<std::int64_t>{0, 0} : roi;
    at::Tensor out = sliding_window_inference(slices, sw, predictor);  // (Z, K, Y, X)
    if (labels) return out.argmax(1).unsqueeze(0).to(at::kCPU, out.size(1) <= 256 ? at::kByte : at::kShort);
    return out.permute({1, 0, 2, 3}).contiguous().to(at::kCPU);
  }
  sw.roi_size = roi.empty() ? std::vector<std::int64_t>(static_cast<std::size_t>(nd), 0) : roi;
  if (labels) return sliding_window_labels(x, sw, predictor);
  return sliding_window_inference(x, sw, predictor)[0].to(at::kCPU);
}

}  // namespace

at::Tensor predict_probabilities(const Trainer& trainer, const at::Tensor& image,
                                 const std::vector<int>& mirror_axes, const PredictOptions& po) {
  return run_windows(trainer, image, mirror_axes, po, false);
}

at::Tensor predict_labels(const Trainer& trainer, const at::Tensor& image,
                          const std::vector<int>& mirror_axes, const PredictOptions& po) {
  return run_windows(trainer, image, mirror_axes, po, true);
}

namespace {

/// Sizes (x, y, z) of a (C, Z, Y, X) tensor.
Size3 size_of(const at::Tensor& t) { return {t.size(3), t.size(2), t.size(1)}; }

bool same_grid(const Geometry& a, const Size3& sa, const Geometry& b, const Size3& sb) {
  return sa == sb && geometry_close(a, b, 1e-6);
}

/// One checkpoint of an ensemble, with the deterministic part of its training pipeline.
struct Member {
  fs::path path;
  std::unique_ptr<Trainer> trainer;
  pipeline::Pipeline pipe;
  std::string stages;         ///< the stage list as JSON text: members with equal text share preprocessing
  std::vector<int> tta_axes;  ///< what this member mirrors
};

/// Probabilities and labels of one case on the input's grid.
struct CasePrediction {
  at::Tensor labels;         ///< (1, Z, Y, X) uint8 (int16 beyond 256 classes)
  at::Tensor probabilities;  ///< (K, Z, Y, X) float32, when asked for
};

/// InferOptions' amp, overlap, blending and stitching, checked and resolved for the device.
Result<PredictOptions> predict_options(const InferOptions& o) {
  SEGFLOW_ASSIGN_OR_RETURN(const c10::Device device, resolve_device(o.device));
  PredictOptions po;
  SEGFLOW_ASSIGN_OR_RETURN(AmpChoice amp,
                           resolve_amp(o.amp.empty() ? (device.is_cuda() ? "auto" : "none") : o.amp, device));
  po.amp = amp.mode;
  if (o.overlap >= 1.0 || (o.overlap < 0.0 && o.overlap != -1.0))
    return invalid_argument("--overlap: expected a number in [0, 1), got " + std::to_string(o.overlap));
  po.overlap = o.overlap;
  if (!o.blend.empty() && o.blend != "gaussian" && o.blend != "constant" && o.blend != "nnunet")
    return invalid_argument("--blend: expected gaussian, constant or nnunet, got '" + o.blend + "'");
  po.blend = o.blend;
  if (o.stitch_device == "cpu") {
    po.stitch_device = "cpu";
  } else if (!o.stitch_device.empty() && o.stitch_device != device.str() &&
             !(o.stitch_device == "cuda" && device.is_cuda())) {
    return invalid_argument("--stitch-device: expected cpu or the model's device (" + device.str() +
                            "), got " + o.stitch_device);
  }
  return po;
}

/// The checkpoints of a run, loaded once.
class Ensemble {
 public:
  static Result<Ensemble> load(const InferOptions& given) {
    // A model package: its members, TTA, overlap, names and postprocessing (sha256s checked).
    Ensemble e;
    InferOptions o = given;
    if (!given.model.empty()) {
      if (!given.checkpoint.empty() || !given.ensemble.empty())
        return invalid_argument("--model: the package names its checkpoints; got --checkpoint as well");
      SEGFLOW_ASSIGN_OR_RETURN(ModelPackage package, read_model_package(given.model));
      o = package_infer_options(package, given);
      if (given.postprocess) e.postprocess_ = std::move(package.postprocessing);
    } else if (!given.postprocess_file.empty()) {
      SEGFLOW_ASSIGN_OR_RETURN(PostprocessPlan plan, read_postprocessing(given.postprocess_file));
      e.postprocess_ = std::move(plan);
    }
    if (o.checkpoint.empty()) return invalid_argument("--checkpoint: required");
    std::vector<fs::path> paths = {o.checkpoint};
    paths.insert(paths.end(), o.ensemble.begin(), o.ensemble.end());
    pipeline::StageRegistry registry = pipeline::builtin_registry();
    SEGFLOW_ASSIGN_OR_RETURN(e.predict_, predict_options(o));
    SEGFLOW_ASSIGN_OR_RETURN(const c10::Device device, resolve_device(o.device));
    const bool channels_last = o.channels_last.value_or(device.is_cuda());
    for (const auto& p : paths) {
      SEGFLOW_ASSIGN_OR_RETURN(auto trainer, load_for_inference(p, o.device, channels_last));
      const ModelInfo& info = trainer->model().info();
      if (info.needs_box)
        return unsupported(p.string() +
                           ": a box-prompted model needs boxes: give --boxes FILE or --boxes-from "
                           "LABELMAP (optionally --propagate; docs/how-to/box-prompted.md)");
      const std::int64_t k = info.out_channels == 1 ? 2 : info.out_channels;
      // Members of different families (a UNet and a PlainConvUNet, 2D and 3D) join as long as
      // they predict the same classes from the same channels: each runs its own stages and
      // window, and its probabilities are resampled onto the first member's grid.
      if (e.members_.empty()) {
        e.classes_ = k;
        e.in_channels_ = info.in_channels;
      } else {
        const std::string first = e.members_.front().path.string();
        if (k != e.classes_)
          return invalid_argument(p.string() + ": cannot join an ensemble with " + first + ": " +
                                  std::to_string(k) + " classes, expected " + std::to_string(e.classes_));
        if (info.in_channels != e.in_channels_)
          return invalid_argument(p.string() + ": cannot join an ensemble with " + first + ": " +
                                  std::to_string(info.in_channels) + " input channels, expected " +
                                  std::to_string(e.in_channels_));
      }
      const JobConfig& cfg = trainer->config();
      SEGFLOW_ASSIGN_OR_RETURN(pipeline::Pipeline pipe,
                               pipeline::build_pipeline(cfg.stages, registry, cfg.file));
      Member m;
      m.path = p;
      m.stages = pipeline::to_json(cfg.stages).dump();
      m.tta_axes = tta_mirror_axes(o.tta, pipe.to_json(), info.spatial_dims);
      m.pipe = std::move(pipe);
      m.trainer = std::move(trainer);
      e.members_.push_back(std::move(m));
    }
    e.names_ = o.class_names;
    // The training's class names, as the checkpoint carries them (model_class_names).
    if (e.names_.empty()) e.names_ = model_class_names(*e.members_.front().trainer);
    return e;
  }

  std::int64_t in_channels() const { return in_channels_; }
  const std::vector<std::string>& names() const { return names_; }
  const std::vector<int>& tta_axes() const { return members_.front().tta_axes; }

  /// Predicts one case (image (C, Z, Y, X) on `input.geometry`).
  Result<CasePrediction> predict(const at::Tensor& image, const Geometry& geometry, const std::string& id,
                                 bool want_probabilities) const {
    if (image.size(0) != in_channels_)
      return invalid_argument(id + ": the model takes " + std::to_string(in_channels_) + " image channel" +
                              (in_channels_ == 1 ? "" : "s") + ", got " + std::to_string(image.size(0)));
    const Size3 input_size = size_of(image);
    std::map<std::string, Sample> preprocessed;  // by stage list
    // Every class's probabilities of the whole volume are held only when they are averaged
    // (an ensemble) or written.
    const bool labels_only = members_.size() == 1 && !want_probabilities;
    at::Tensor sum, streamed;
    Geometry ref_geometry;
    Size3 ref_size{0, 0, 0};
    for (const Member& m : members_) {
      auto it = preprocessed.find(m.stages);
      if (it == preprocessed.end()) {
        Sample s;
        s.id = id;
        s.tensors["image"] = image.to(at::kFloat);
        s.geometry = geometry;
        // Stages written for (image, label) pairs get an empty label map, dropped afterwards.
        s.tensors["label"] = torch::zeros({1, image.size(1), image.size(2), image.size(3)}, at::kByte);
        SEGFLOW_ASSIGN_OR_RETURN(Sample pre, m.pipe.run_deterministic(std::move(s)));
        it = preprocessed.emplace(m.stages, std::move(pre)).first;
      }
      const Sample& pre = it->second;
      if (labels_only) {  // one model, no probabilities wanted: the argmax streamed, slab by slab
        streamed = predict_labels(*m.trainer, pre.at("image"), m.tta_axes, predict_);
        ref_geometry = pre.geometry;
        ref_size = size_of(streamed);
        break;
      }
      at::Tensor p = predict_probabilities(*m.trainer, pre.at("image"), m.tta_axes, predict_);
      const Size3 p_size = size_of(p);
      if (!sum.defined()) {
        sum = p;
        ref_geometry = pre.geometry;
        ref_size = p_size;
      } else if (same_grid(pre.geometry, p_size, ref_geometry, ref_size)) {
        sum += p;
      } else {
        sum += pipeline::resample_to_grid(p, pre.geometry, ref_geometry, ref_size);
      }
    }
    at::Tensor probs;
    if (!labels_only) probs = members_.size() == 1 ? sum : sum.div_(static_cast<double>(members_.size()));
    const auto label_type = classes_ <= 256 ? at::kByte : at::kShort;
    at::Tensor labels = labels_only ? streamed.to(label_type) : probs.argmax(0, true).to(label_type);
    CasePrediction out;
    const bool same = same_grid(ref_geometry, ref_size, geometry, input_size);
    out.labels = same ? labels : pipeline::resample_to_grid(labels, ref_geometry, geometry, input_size);
    if (postprocess_) {
      SEGFLOW_ASSIGN_OR_RETURN(out.labels, apply_postprocessing(out.labels, *postprocess_));
    }
    if (want_probabilities) {
      if (same) {
        out.probabilities = probs;
      } else {
        at::Tensor q = pipeline::resample_to_grid(probs, ref_geometry, geometry, input_size);
        // Outside the preprocessed grid (a crop) nothing was predicted: background.
        q[0] += (1.0 - q.sum(0)).clamp_min(0.0);
        out.probabilities = q;
      }
    }
    return out;
  }

 private:
  std::vector<Member> members_;
  std::int64_t classes_ = 2, in_channels_ = 1;
  std::vector<std::string> names_;
  PredictOptions predict_;  ///< amp, overlap, stitching (InferOptions, resolved for the device)
  std::optional<PostprocessPlan> postprocess_;  ///< a model package's, applied to each label map
};

/// "<dir>/x.nii.gz" -> "<dir>/x_probabilities.nii.gz" (also for .dcm and the other endings
/// of the format table: x.nrrd, x.mha).
fs::path probabilities_path(const fs::path& label_file) {
  std::string name = label_file.filename().string();
  const std::string e = label_file.extension() == ".dcm" ? ".dcm" : pipeline::format_ending(label_file);
  if (!e.empty() && name.size() > e.size()) name.resize(name.size() - e.size());
  return label_file.parent_path() / (name + "_probabilities.nii.gz");
}

/// Writes a case's label map (write_label_map) and, when predicted, its probabilities.
/// `more`: InferOptions::also_output (one scan).
Result<InferResult> write_case(const CasePrediction& pred, const pipeline::Image& input, const fs::path& out,
                               const std::vector<fs::path>& more, const fs::path& dicom_source,
                               const std::vector<std::string>& names) {
  SEGFLOW_RETURN_IF_ERROR(write_label_maps(out, more, input, pred.labels, dicom_source, names));
  InferResult r;
  r.output = out;
  r.also_written = more;
  r.size = input.size();  // the labels are on the input's grid
  at::Tensor u = std::get<0>(at::_unique(pred.labels.flatten().to(at::kLong), true));
  for (std::int64_t i = 0; i < u.numel(); ++i) r.labels.push_back(u[i].item<std::int64_t>());
  if (pred.probabilities.defined()) {
    pipeline::Image prob;
    prob.voxels = pred.probabilities.to(at::kFloat).contiguous();
    prob.geometry = input.geometry;
    r.probabilities = probabilities_path(out);
    SEGFLOW_RETURN_IF_ERROR(pipeline::write_nifti(r.probabilities, prob));
  }
  return r;
}

/// Reads a case's channels and stacks them; they must share one grid.
Result<pipeline::Image> read_case(const InferCase& c) {
  if (c.channels.empty()) return invalid_argument(c.id + ": no image files");
  SEGFLOW_ASSIGN_OR_RETURN(pipeline::Image first, pipeline::read_image(c.channels.front()));
  if (c.channels.size() == 1) return first;
  std::vector<at::Tensor> parts = {first.voxels.to(at::kFloat)};
  for (std::size_t i = 1; i < c.channels.size(); ++i) {
    SEGFLOW_ASSIGN_OR_RETURN(pipeline::Image ch, pipeline::read_image(c.channels[i]));
    if (ch.size() != first.size() || !geometry_close(ch.geometry, first.geometry, 1e-3))
      return invalid_argument(c.channels[i].string() + ": channel " + std::to_string(i) + " of case " + c.id +
                              " is on another grid than channel 0 (" + describe(ch.geometry) + " vs " +
                              describe(first.geometry) + ")");
    parts.push_back(ch.voxels.to(at::kFloat));
  }
  first.voxels = torch::cat(parts, 0).contiguous();
  return first;
}

bool is_dicom_input(const fs::path& p) {
  const auto f = pipeline::detect_format(p);
  return f == pipeline::ImageFormat::dicom_file || f == pipeline::ImageFormat::dicom_folder;
}

}  // namespace

bool is_single_scan(const fs::path& input) {
  std::error_code ec;
  if (fs::is_regular_file(input, ec)) return true;
  return pipeline::is_dicom_case_folder(input);
}

Result<std::vector<InferCase>> list_inference_cases(
    const fs::path& input, std::vector<std::pair<std::string, std::string>>* skipped) {
  std::error_code ec;
  if (!fs::exists(input, ec)) return not_found(input.string() + ": no such file or folder");
  if (is_single_scan(input)) {
    fs::path p = input;
    if (p.filename().empty()) p = p.parent_path();
    return std::vector<InferCase>{
        {pipeline::strip_channel_zero(pipeline::case_id_of(p)), {input}, is_dicom_input(input)}};
  }
  fs::path dir = input;
  for (const char* sub : {"imagesTs", "imagesTr", "imgs"})
    if (fs::is_directory(input / sub, ec)) {
      dir = input / sub;
      break;
    }
  std::vector<fs::path> files, folders;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const fs::path& p = e.path();
    if (pipeline::is_hidden(p)) continue;
    if (e.is_directory()) {
      if (pipeline::is_dicom_case_folder(p)) folders.push_back(p);
    } else if (e.is_regular_file() && !pipeline::is_side_file(p)) {
      files.push_back(p);
    }
  }
  if (ec) return io_error(dir.string() + ": cannot list the folder: " + ec.message());
  std::sort(files.begin(), files.end());
  std::sort(folders.begin(), folders.end());
  const bool channels = !files.empty() && std::all_of(files.begin(), files.end(), [](const fs::path& p) {
    return pipeline::has_channel_suffix(pipeline::case_id_of(p));
  });
  std::map<std::string, InferCase> cases;
  if (channels) {
    std::vector<std::pair<std::string, fs::path>> stems;
    for (const auto& p : files) stems.emplace_back(pipeline::case_id_of(p), p);
    std::vector<pipeline::SkippedFile> gaps;
    for (auto& [id, chans] : pipeline::group_channels(stems, gaps)) {
      const bool dicom = is_dicom_input(chans.front());
      cases[id] = InferCase{id, std::move(chans), dicom};
    }
    if (skipped)
      for (const auto& g : gaps) skipped->emplace_back(g.path.string(), g.reason);
  } else {
    for (const auto& p : files) {
      const std::string id = pipeline::case_id_of(p);
      cases[id] = InferCase{id, {p}, is_dicom_input(p)};
    }
  }
  for (const auto& f : folders) {
    const std::string id = f.filename().string();
    if (cases.count(id)) {
      if (skipped) skipped->emplace_back(f.string(), "case " + id + " is also a file in " + dir.string());
      continue;
    }
    cases[id] = InferCase{id, {f}, true};
  }
  if (cases.empty())
    return not_found(dir.string() +
                     ": no scans found (expected image files, DICOM series folders or a dataset)");
  std::vector<InferCase> out;
  for (auto& [id, c] : cases) out.push_back(std::move(c));
  return out;
}

Result<InferResult> run_inference(const InferOptions& o) {
  try {
    const auto t0 = std::chrono::steady_clock::now();
    SEGFLOW_ASSIGN_OR_RETURN(Ensemble ensemble, Ensemble::load(o));
    SEGFLOW_ASSIGN_OR_RETURN(pipeline::Image input, pipeline::read_image(o.input));
    const bool dicom = is_dicom_input(o.input);
    fs::path out = o.output;
    std::error_code ec;
    const bool to_folder = fs::is_directory(out, ec) || out.string().ends_with("/");
    if (to_folder) {
      fs::create_directories(out, ec);
      const std::string stem =
          pipeline::is_nifti_path(o.input) ? pipeline::image_stem(o.input) : o.input.filename().string();
      const bool seg = o.format == "seg" || (o.format.empty() && dicom);
      out = seg ? out / "seg.dcm" : out / (stem + "_seg.nii.gz");
    }
    SEGFLOW_RETURN_IF_ERROR(check_label_map_path(out));  // before the prediction, not after
    SEGFLOW_RETURN_IF_ERROR(check_also_output(o.also_output, dicom, o.input));
    const std::string id = pipeline::strip_channel_zero(pipeline::case_id_of(o.input));
    SEGFLOW_ASSIGN_OR_RETURN(CasePrediction pred,
                             ensemble.predict(input.voxels, input.geometry, id, o.save_probabilities));
    SEGFLOW_ASSIGN_OR_RETURN(InferResult r, write_case(pred, input, out, o.also_output,
                                                       dicom ? o.input : fs::path(), ensemble.names()));
    r.case_id = id;
    r.tta_axes = ensemble.tta_axes();
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  } catch (const c10::Error& e) {
    return internal_error(o.input.string() + ": " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return internal_error(o.input.string() + ": " + e.what());
  }
}

Result<InferBatchResult> run_inference_batch(const InferOptions& o,
                                             const std::function<void(const InferProgress&)>& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  if (!o.format.empty() && o.format != "nifti" && o.format != "seg")
    return invalid_argument("--format: expected nifti or seg, got '" + o.format + "'");
  if (!o.also_output.empty())
    return invalid_argument("--also-output " + o.also_output.front().string() +
                            ": names a file of one scan; " + o.input.string() + " is a folder or dataset");
  InferBatchResult result;
  std::vector<InferCase> cases = o.cases;
  if (cases.empty()) {
    SEGFLOW_ASSIGN_OR_RETURN(cases, list_inference_cases(o.input, &result.skipped));
  }
  std::error_code ec;
  if (fs::exists(o.output, ec) && !fs::is_directory(o.output, ec))
    return invalid_argument(o.output.string() + ": --output: expected a folder for the " +
                            std::to_string(cases.size()) + " cases of " + o.input.string() + ", got a file");
  Result<Ensemble> loaded = [&]() -> Result<Ensemble> {
    try {
      return Ensemble::load(o);
    } catch (const std::exception& e) {
      return internal_error(o.checkpoint.string() + ": " + e.what());
    }
  }();
  if (!loaded.is_ok()) return loaded.status();
  fs::create_directories(o.output, ec);
  if (ec) return io_error(o.output.string() + ": cannot create the folder: " + ec.message());
  const Ensemble& ensemble = *loaded;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const InferCase& c = cases[i];
    InferProgress p;
    p.index = i;
    p.total = cases.size();
    p.case_id = c.id;
    if (progress) progress(p);
    const auto c0 = std::chrono::steady_clock::now();
    const bool seg = o.format == "seg" || (o.format.empty() && c.dicom);
    const fs::path out = o.output / (c.id + (seg ? ".dcm" : ".nii.gz"));
    Result<InferResult> r = [&]() -> Result<InferResult> {
      try {
        SEGFLOW_ASSIGN_OR_RETURN(pipeline::Image input, read_case(c));
        SEGFLOW_ASSIGN_OR_RETURN(CasePrediction pred,
                                 ensemble.predict(input.voxels, input.geometry, c.id, o.save_probabilities));
        return write_case(pred, input, out, {}, c.dicom ? c.channels.front() : fs::path(), ensemble.names());
      } catch (const c10::Error& e) {
        return internal_error(c.id + ": " + e.what_without_backtrace());
      } catch (const std::exception& e) {
        return internal_error(c.id + ": " + e.what());
      }
    }();
    p.done = true;
    p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
    if (r.is_ok()) {
      r->case_id = c.id;
      r->tta_axes = ensemble.tta_axes();
      r->seconds = p.seconds;
      p.output = r->output;
      result.outputs.push_back(std::move(*r));
    } else {
      p.error = r.status().message();
      result.failed.emplace_back(c.id, p.error);
    }
    if (progress) progress(p);
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

InferOptions package_infer_options(const ModelPackage& p, const InferOptions& base) {
  InferOptions o = base;
  o.model.clear();
  o.checkpoint = p.dir / p.members.front().checkpoint;
  o.ensemble.clear();
  for (std::size_t i = 1; i < p.members.size(); ++i) o.ensemble.push_back(p.dir / p.members[i].checkpoint);
  o.tta = p.tta;
  if (o.overlap < 0) o.overlap = p.overlap;
  if (o.class_names.empty()) o.class_names = p.class_names;
  return o;
}

Status check_label_map_path(const fs::path& out, std::string_view flag) {
  if (out.extension() == ".dcm") return Status::ok();
  const pipeline::ImageFormatInfo* f = pipeline::image_format_info(pipeline::format_from_name(out));
  if (f && f->write) return Status::ok();
  std::string endings;
  for (const auto& x : pipeline::image_formats())
    if (x.write)
      for (const auto& e : x.extensions) endings += e + ", ";
  return invalid_argument(out.string() + ": " + std::string(flag) + ": expected " +
                          (flag == "--output" ? "a folder, " : "") +
                          "a .dcm (DICOM SEG) or a label map file " + "of a format segflow writes (" +
                          endings.substr(0, endings.size() - 2) + ")");
}

Status check_also_output(const std::vector<fs::path>& files, bool dicom_input, const fs::path& input) {
  for (const fs::path& f : files) {
    SEGFLOW_RETURN_IF_ERROR(check_label_map_path(f, "--also-output"));
    if (f.extension() == ".dcm" && !dicom_input)
      return invalid_argument(f.string() + ": --also-output: a DICOM SEG needs a DICOM input, got " +
                              input.string());
  }
  return Status::ok();
}

Status write_label_map(const fs::path& out, const pipeline::Image& input, const at::Tensor& labels,
                       const fs::path& dicom_source, const std::vector<std::string>& names) {
  SEGFLOW_RETURN_IF_ERROR(check_label_map_path(out));
  pipeline::Image seg;
  seg.voxels = labels.contiguous();
  seg.geometry = input.geometry;
  seg.modality = "SEG";
  if (out.extension() != ".dcm")
    return pipeline::image_format_info(pipeline::format_from_name(out))->write(out, seg);
  // The SEG references the slices read: the stack read_dicom chose (not localizers or other
  // series of the folder). A segment per value up to the largest, named where a name is known.
  SEGFLOW_ASSIGN_OR_RETURN(pipeline::DicomSeriesInfo ref, pipeline::dicom_source_series(dicom_source));
  const std::int64_t top = labels.numel() > 0 ? labels.max().item<std::int64_t>() : 0;
  std::vector<pipeline::SegmentStyle> styles(
      std::max<std::size_t>(names.size(), static_cast<std::size_t>(top + 1)));
  for (std::size_t v = 0; v < styles.size(); ++v)
    styles[v] = {v < names.size() ? names[v] : "",
                 pipeline::default_segment_colour(static_cast<std::int64_t>(v))};
  return pipeline::write_dicom_seg(out, seg, ref, styles);
}

Status write_label_maps(const fs::path& out, const std::vector<fs::path>& more, const pipeline::Image& input,
                        const at::Tensor& labels, const fs::path& dicom_source,
                        const std::vector<std::string>& names) {
  std::vector<fs::path> files = {out};
  files.insert(files.end(), more.begin(), more.end());
  for (const fs::path& f : files)
    if (f.extension() == ".dcm" && dicom_source.empty())
      return invalid_argument(f.string() + ": DICOM SEG output needs a DICOM input, got " +
                              input.source.string());
  std::stable_partition(files.begin(), files.end(),
                        [](const fs::path& f) { return f.extension() != ".dcm"; });
  Status first = Status::ok();
  for (const fs::path& f : files) {
    Status st = write_label_map(f, input, labels, dicom_source, names);
    if (first.is_ok()) first = std::move(st);
  }
  return first;
}

}  // namespace segflow::models
