#include "models/inference/infer_request.hpp"

#include <algorithm>
#include <system_error>

#include "models/training/trainer.hpp"
#include "pipeline/options.hpp"

namespace segflow::models {

namespace {

using K = InferFieldKind;
constexpr auto kCall = InferFieldScope::call;

// One row per field; bind() reads them in this order. Adding an option: a row here, its read
// in bind() and to_json(), and where models uses it.
constexpr InferField kInferFields[] = {
    {"checkpoint", "PATH",
     "a run's best.pt or last.pt; repeat for an ensemble (the mean of the members' probabilities); required "
     "unless model",
     "", K::paths, kCall},
    {"model", "MODEL_DIR",
     "a segflow package: its members as the ensemble, its TTA, overlap, class names and postprocessing, "
     "after checking every file's sha256; not with checkpoint, tta or postprocess",
     "model package", K::path, kCall},
    {"input", "SCAN|DIR|DATASET",
     "a scan (a file or a DICOM series folder), a folder of scans or a dataset; required", "", K::path,
     kCall},
    {"output", "PATH",
     "for one scan a label map file (.nii.gz, .nii, .nrrd or .mha: the format by its ending) or a .dcm "
     "SEG; a folder otherwise (one file per case); required",
     "", K::path, kCall},
    {"also_output", "PATH",
     "one scan: another label map file (.nii.gz, .nrrd, .mha, .dcm SEG) written from the same prediction; "
     "repeatable (the model runs once)",
     "", K::paths, kCall},
    {"device", "D", "auto (default), cpu or cuda:N", "", K::text, kCall},
    {"tta", "none|mirror|mirror-all",
     "test-time mirroring: none (default), the axes the training flipped, or all axes",
     "sliding window (not with box prompts)", K::text, kCall},
    {"format", "nifti|seg", "the files of a folder output; default SEG for DICOM inputs, else NIfTI", "",
     K::text, kCall},
    {"class_names", "bg,liver,...",
     "names of label values 0..K-1 for the SEG segments; default the training's", "", K::names},
    {"amp", "auto|none|bf16|fp16",
     "mixed precision of the forward passes (as train.amp); default auto on CUDA, none on the CPU", "",
     K::text},
    {"overlap", "F", "sliding-window overlap in [0, 1); default the run's validation.overlap",
     "sliding window (not with box prompts)", K::number},
    {"blend", "gaussian|constant|nnunet",
     "window placement and weights: segflow's Gaussian or equal weights (MONAI's layout), or nnunet: "
     "nnU-Net's predictor (its layout and Gaussian, logits averaged before the softmax); default the run's "
     "validation.mode",
     "sliding window (not with box prompts)", K::text},
    {"stitch_device", "cpu",
     "stitch the windows in host memory (a large volume's class maps need not fit the GPU); default the "
     "model's device",
     "sliding window (not with box prompts)", K::text},
    {"postprocess", "FILE|none",
     "a postprocessing.json applied to each label map before it is written; default the one beside the "
     "first checkpoint, when there is one; none: none",
     "sliding window (not with box prompts)", K::path},
    {"channels_last", "on|off",
     "channels-last weights and inputs (faster 3D convolutions on GPUs); default on on CUDA, off on the CPU",
     "sliding window (not with box prompts)", K::on_off},
    {"save_probabilities", "", "also write <label map name>_probabilities.nii.gz",
     "sliding window (not with box prompts)", K::flag},
    {"no_postprocess", "", "with model: skip the package's postprocessing", "model package", K::flag},
    {"boxes", "FILE",
     "box prompts of a box-prompted (sam) checkpoint: a JSON or CSV box file (for a folder input: a folder "
     "of "
     "them, one per case)",
     "box prompts (a sam checkpoint)", K::path, kCall},
    {"boxes_from", "LABELMAP",
     "box prompts from a label map on the input's grid: each label's box on each slice it covers",
     "box prompts (a sam checkpoint)", K::path, kCall},
    {"propagate", "", "one seed box per label, propagated slice by slice to the rest of the volume",
     "box prompts (a sam checkpoint)", K::flag, kCall},
    {"box_margin", "N", "with propagate: voxels the previous slice's mask box grows per side; default 3",
     "box prompts (a sam checkpoint)", K::number, kCall},
};

std::string doc(std::string_view key) {
  for (const InferField& f : kInferFields)
    if (f.key == key) return std::string(f.help);
  return {};
}

/// A string of `names` ("" too when `empty_ok`): "expected none, mirror or mirror-all, got \"x\"".
void one_of(pipeline::OptionParser& p, const char* key, std::string& field, std::vector<std::string> names,
            bool empty_ok, const char* help) {
  std::string v = field;
  p.string(key, v, help);
  if (!p.ok() || !p.given(key)) return;
  if ((empty_ok && v.empty()) || std::find(names.begin(), names.end(), v) != names.end()) {
    field = v;
    return;
  }
  std::string expected;
  for (std::size_t i = 0; i < names.size(); ++i)
    expected += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  p.fail(key, "expected " + expected + ", got \"" + v + "\"");
}

std::vector<std::string> as_strings(const std::vector<std::filesystem::path>& paths) {
  std::vector<std::string> out;
  out.reserve(paths.size());
  for (const auto& p : paths) out.push_back(p.string());
  return out;
}

}  // namespace

std::span<const InferField> infer_fields() { return kInferFields; }

std::string flag_name(std::string_view key) {
  std::string f(key);
  std::replace(f.begin(), f.end(), '_', '-');
  return f;
}

void InferRequest::bind(pipeline::OptionParser& p, bool options_only) {
  InferOptions& o = options;
  std::string text;
  if (!options_only) {
    std::vector<std::string> checkpoints = as_strings({o.checkpoint});
    if (o.checkpoint.empty()) checkpoints.clear();
    for (const auto& e : as_strings(o.ensemble)) checkpoints.push_back(e);
    p.strings("checkpoint", checkpoints, false, doc("checkpoint").c_str());
    if (p.ok() && p.given("checkpoint")) {
      o.checkpoint = checkpoints.empty() ? std::filesystem::path() : std::filesystem::path(checkpoints[0]);
      o.ensemble.assign(checkpoints.begin() + (checkpoints.empty() ? 0 : 1), checkpoints.end());
    }
    text = o.model.string();
    p.string("model", text, doc("model").c_str());
    o.model = text;
    text = o.input.string();
    p.string("input", text, doc("input").c_str());
    o.input = text;
    text = o.output.string();
    p.string("output", text, doc("output").c_str());
    o.output = text;
    std::vector<std::string> more = as_strings(o.also_output);
    p.strings("also_output", more, false, doc("also_output").c_str());
    o.also_output.assign(more.begin(), more.end());
    p.string("device", o.device, doc("device").c_str());
    if (p.ok() && o.device.empty()) return p.fail("device", "expected auto, cpu or cuda:N, got \"\"");
    if (p.ok() && o.device != "auto") {
      auto d = resolve_device(o.device);
      if (!d.is_ok()) {
        std::string m = d.status().message();
        if (m.rfind("device: ", 0) == 0) m.erase(0, 8);
        return p.fail("device", m);
      }
    }
    text = to_string(o.tta);
    one_of(p, "tta", text, {"none", "mirror", "mirror-all"}, false, doc("tta").c_str());
    if (auto t = parse_tta(text); t.is_ok()) o.tta = *t;
    one_of(p, "format", o.format, {"nifti", "seg"}, true, doc("format").c_str());
  }
  p.strings("class_names", o.class_names, false, doc("class_names").c_str());
  one_of(p, "amp", o.amp, {"auto", "none", "bf16", "fp16"}, true, doc("amp").c_str());
  p.number("overlap", o.overlap, pipeline::Range{0.0, 1.0, false, true}, "", doc("overlap").c_str());
  one_of(p, "blend", o.blend, {"gaussian", "constant", "nnunet"}, true, doc("blend").c_str());
  p.string("stitch_device", o.stitch_device, doc("stitch_device").c_str());
  p.string("postprocess", postprocess, doc("postprocess").c_str());
  bool channels_last = o.channels_last.value_or(false);
  p.boolean("channels_last", channels_last, doc("channels_last").c_str());
  if (p.given("channels_last")) o.channels_last = channels_last;
  p.boolean("save_probabilities", o.save_probabilities, doc("save_probabilities").c_str());
  bool no_postprocess = !o.postprocess;
  p.boolean("no_postprocess", no_postprocess, doc("no_postprocess").c_str());
  o.postprocess = !no_postprocess;
  if (!options_only) {
    p.string("boxes", boxes, doc("boxes").c_str());
    p.string("boxes_from", boxes_from, doc("boxes_from").c_str());
    p.boolean("propagate", propagate, doc("propagate").c_str());
    p.integer("box_margin", box_margin, pipeline::Range::at_least(0), "voxels", doc("box_margin").c_str());
  }
  if (p.ok() && !options_only) p.add_error(check());
}

Status InferRequest::check() const {
  const InferOptions& o = options;
  if (!o.model.empty() && !o.checkpoint.empty())
    return invalid_argument("model: a package names its checkpoints; got checkpoint " +
                            o.checkpoint.string() + " too");
  if (!o.model.empty() && o.tta != TtaMode::none)
    return invalid_argument(std::string("model: a package sets its TTA; got tta ") + to_string(o.tta) +
                            " too");
  if (!o.model.empty() && !postprocess.empty())
    return invalid_argument("postprocess: a package sets its postprocessing (no_postprocess skips it)");
  if (!box_prompted()) return Status::ok();
  if (boxes.empty() == boxes_from.empty())
    return invalid_argument("boxes or boxes_from: expected one of them for box-prompted inference");
  if (!o.model.empty()) return invalid_argument("model: box prompts take a checkpoint, not a package");
  if (!o.ensemble.empty())
    return invalid_argument("checkpoint: box prompts take one checkpoint, not an ensemble");
  if (o.tta != TtaMode::none)
    return invalid_argument(std::string("tta: box-prompted inference has no TTA; got ") + to_string(o.tta));
  const char* sliding = o.overlap >= 0                ? "overlap"
                        : !o.blend.empty()            ? "blend"
                        : !o.stitch_device.empty()    ? "stitch_device"
                        : !postprocess.empty()        ? "postprocess"
                        : o.channels_last.has_value() ? "channels_last"
                        : o.save_probabilities        ? "save_probabilities"
                                                      : nullptr;
  if (sliding)
    return invalid_argument(std::string(sliding) + ": a sliding-window option; box prompts have none");
  return Status::ok();
}

nlohmann::json InferRequest::to_json() const {
  const InferOptions& o = options;
  nlohmann::json j = nlohmann::json::object();
  if (!o.checkpoint.empty()) {
    nlohmann::json list = {o.checkpoint.string()};
    for (const auto& e : o.ensemble) list.push_back(e.string());
    j["checkpoint"] = list;
  }
  if (!o.model.empty()) j["model"] = o.model.string();
  if (!o.input.empty()) j["input"] = o.input.string();
  if (!o.output.empty()) j["output"] = o.output.string();
  if (!o.also_output.empty()) j["also_output"] = as_strings(o.also_output);
  j["device"] = o.device;
  j["tta"] = to_string(o.tta);
  if (!o.format.empty()) j["format"] = o.format;
  if (!o.class_names.empty()) j["class_names"] = o.class_names;
  if (!o.amp.empty()) j["amp"] = o.amp;
  if (o.overlap >= 0) j["overlap"] = o.overlap;
  if (!o.blend.empty()) j["blend"] = o.blend;
  if (!o.stitch_device.empty()) j["stitch_device"] = o.stitch_device;
  if (!postprocess.empty()) j["postprocess"] = postprocess;
  if (o.channels_last) j["channels_last"] = *o.channels_last;
  if (o.save_probabilities) j["save_probabilities"] = true;
  if (!o.postprocess) j["no_postprocess"] = true;
  if (!boxes.empty()) j["boxes"] = boxes;
  if (!boxes_from.empty()) j["boxes_from"] = boxes_from;
  if (propagate) j["propagate"] = true;
  if (box_margin >= 0) j["box_margin"] = box_margin;
  return j;
}

std::filesystem::path InferRequest::postprocess_file() const {
  if (!options.model.empty() || postprocess == "none" || box_prompted()) return {};
  if (!postprocess.empty()) return postprocess;
  if (options.checkpoint.empty()) return {};
  const std::filesystem::path beside = options.checkpoint.parent_path() / "postprocessing.json";
  std::error_code ec;
  return std::filesystem::is_regular_file(beside, ec) ? beside : std::filesystem::path();
}

InferOptions InferRequest::run_options() const {
  InferOptions o = options;
  o.postprocess_file = postprocess_file();
  return o;
}

BoxInferOptions InferRequest::box_options() const {
  BoxInferOptions b;
  b.checkpoint = options.checkpoint;
  b.input = options.input;
  b.output = options.output;
  b.also_output = options.also_output;
  b.device = options.device;
  b.boxes = boxes;
  b.boxes_from = boxes_from;
  b.propagate = propagate;
  if (box_margin >= 0) b.box_margin = box_margin;
  b.class_names = options.class_names;
  b.format = options.format;
  b.amp = options.amp;
  return b;
}

Result<InferRequest> read_infer_request(const nlohmann::json& fields, const std::string& where,
                                        std::initializer_list<const char*> also) {
  pipeline::OptionParser p(fields, where);
  p.name_keys("field", "infer");
  InferRequest r;
  r.bind(p);
  for (const char* k : also) {
    nlohmann::json ignored;
    p.json_value(k, ignored, "any", "");
  }
  SEGFLOW_RETURN_IF_ERROR(p.finish());
  return r;
}

}  // namespace segflow::models
