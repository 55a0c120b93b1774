// segflow infer: one scan, a folder of scans or a dataset through one checkpoint or an
// ensemble, with optional mirroring TTA and saved probabilities (models/inference/inference.hpp).
#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>

#include "apps/cli_args.hpp"
#include "apps/commands.hpp"
#include "apps/infer_boxes.hpp"
#include "models/inference/inference.hpp"
#include "models/inference/postprocessing_plan.hpp"
#include "pipeline/io/image_io.hpp"

namespace segflow::apps {

namespace {

/// Progress on stderr: an updating bar on a terminal, a plain line per case otherwise.
class ProgressBar {
 public:
  explicit ProgressBar(bool quiet) : quiet_(quiet), tty_(isatty(STDERR_FILENO) != 0) {}

  void operator()(const models::InferProgress& p) {
    if (quiet_) return;
    if (!started_) {
      start_ = std::chrono::steady_clock::now();
      started_ = true;
    }
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const std::size_t finished = p.index + (p.done ? 1 : 0);
    const double eta =
        finished > 0 ? el / static_cast<double>(finished) * static_cast<double>(p.total - finished) : NAN;
    if (!tty_) {
      if (!p.done) return;
      if (p.error.empty())
        std::fprintf(stderr, "infer %zu/%zu %s: %.2f s -> %s\n", p.index + 1, p.total, p.case_id.c_str(),
                     p.seconds, p.output.string().c_str());
      else
        std::fprintf(stderr, "infer %zu/%zu %s: failed: %s\n", p.index + 1, p.total, p.case_id.c_str(),
                     p.error.c_str());
      return;
    }
    if (p.done && !p.error.empty())
      std::fprintf(stderr, "\r\033[Kinfer %s: failed: %s\n", p.case_id.c_str(), p.error.c_str());
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * finished / std::max<std::size_t>(1, p.total));
    std::string bar(static_cast<std::size_t>(filled), '#');
    bar.resize(kWidth, '.');
    std::fprintf(stderr, "\r\033[K[%s] %zu/%zu %s%s ETA %s", bar.c_str(), finished, p.total,
                 p.done ? "done " : "", p.case_id.c_str(), clock_text(eta).c_str());
    if (p.done && finished == p.total) std::fputc('\n', stderr);
    std::fflush(stderr);
  }

 private:
  bool quiet_, tty_;
  bool started_ = false;
  std::chrono::steady_clock::time_point start_;
};

nlohmann::json result_json(const models::InferResult& r) {
  nlohmann::json j = {{"case", r.case_id},
                      {"output", r.output.string()},
                      {"size", r.size},
                      {"labels", r.labels},
                      {"seconds", r.seconds}};
  if (!r.probabilities.empty()) j["probabilities"] = r.probabilities.string();
  nlohmann::json axes = nlohmann::json::array();
  for (int a : r.tta_axes) axes.push_back(std::string(1, "xyz"[a]));
  j["tta_axes"] = axes;
  return j;
}

/// The postprocessing to apply: --postprocess FILE, none with "none", else the
/// postprocessing.json beside the (first) checkpoint when there is one.
Result<std::optional<models::PostprocessPlan>> postprocess_plan(const Args& a,
                                                                const models::InferOptions& o) {
  std::filesystem::path file = a.get("postprocess");
  // A package's postprocessing is applied by models::run_inference.
  if (file == "none" || !o.model.empty()) return std::optional<models::PostprocessPlan>();
  std::error_code ec;
  if (file.empty()) {
    file = o.checkpoint.parent_path() / "postprocessing.json";
    if (!std::filesystem::exists(file, ec)) return std::optional<models::PostprocessPlan>();
    std::fprintf(stderr, "segflow infer: applying %s (--postprocess none: do not)\n", file.c_str());
  }
  if (o.format == "seg") return invalid_argument("--postprocess: applies to NIfTI outputs, got --format seg");
  auto plan = models::read_postprocessing(file);
  if (!plan.is_ok()) return plan.status();
  return std::optional<models::PostprocessPlan>(*plan);
}

/// Applies the plan to a written label map and updates its distinct values.
Status postprocess_output(models::InferResult& r, const std::optional<models::PostprocessPlan>& plan) {
  if (!plan) return Status::ok();
  if (r.output.extension() == ".dcm")
    return invalid_argument("--postprocess: applies to NIfTI outputs, got " + r.output.string());
  SEGFLOW_RETURN_IF_ERROR(models::apply_postprocessing_file(r.output, r.output, *plan));
  auto img = pipeline::read_image(r.output);
  if (!img.is_ok()) return img.status();
  const at::Tensor values = std::get<0>(at::_unique(img->voxels.flatten().to(at::kLong)));
  r.labels.assign(values.data_ptr<std::int64_t>(), values.data_ptr<std::int64_t>() + values.numel());
  return Status::ok();
}

/// --model MODEL_DIR (a `segflow package`): its members, TTA and postprocessing replace
/// --checkpoint, --tta and --postprocess; --no-postprocess skips its postprocessing.
Status model_package_options(const Args& a, models::InferOptions& o) {
  o.postprocess = !a.flag("no-postprocess");
  if (!a.has("model")) return Status::ok();
  for (const char* k : {"checkpoint", "tta", "postprocess"})
    if (a.has(k))
      return invalid_argument(std::string("--") + k + ": not with --model (the package sets it" +
                              (k == std::string("postprocess") ? "; --no-postprocess skips it)" : ")"));
  o.model = a.get("model");
  return Status::ok();
}

constexpr Option kInferOptions[] = {
    {"checkpoint", "PATH",
     "a run's best.pt or last.pt; repeat for an ensemble (the mean of the members' probabilities); required "
     "unless --model"},
    {"input", "SCAN|DIR|DATASET",
     "a scan (a file or a DICOM series folder), a folder of scans or a dataset; required"},
    {"output", "PATH",
     "for one scan a .nii/.nii.gz label map or a .dcm SEG; a folder otherwise (one file per case); required"},
    {"device", "D", "auto (default), cpu or cuda:N"},
    {"format", "nifti|seg", "the files of a folder output; default SEG for DICOM inputs, else NIfTI"},
    {"class-names", "bg,liver,...",
     "names of label values 0..K-1 for the SEG segments; default the training's"},
    {"amp", "auto|none|bf16|fp16",
     "mixed precision of the forward passes (as train.amp); default auto on CUDA, none on the CPU"},
    {"quiet", "", "no progress lines on stderr"},
};
/// What box-prompted inference refuses (apps/cmd_infer_boxes.cpp).
constexpr Option kSlidingWindowOptions[] = {
    {"tta", "none|mirror|mirror-all",
     "test-time mirroring: none (default), the axes the training flipped, or all axes"},
    {"overlap", "F", "sliding-window overlap in [0, 1); default the run's validation.overlap"},
    {"stitch-device", "cpu",
     "stitch the windows in host memory (a large volume's class maps need not fit the GPU); default the "
     "model's device"},
    {"postprocess", "FILE|none",
     "a postprocessing.json applied to each written label map (NIfTI outputs); default the one beside the "
     "first checkpoint, when there is one; none: none"},
    {"channels-last", "on|off",
     "channels-last weights and inputs (faster 3D convolutions on GPUs); default on on CUDA, off on the CPU"},
    {"save-probabilities", "", "also write <label map name>_probabilities.nii.gz"},
};
constexpr Option kPackageInferOptions[] = {
    {"model", "MODEL_DIR",
     "a segflow package: its members as the ensemble, its TTA, overlap, class names and postprocessing, "
     "after checking every file's sha256; not with --checkpoint, --tta or --postprocess"},
    {"no-postprocess", "", "with --model: skip the package's postprocessing"},
};

}  // namespace

std::span<const Option> sliding_window_options() { return kSlidingWindowOptions; }

const Command& infer_command() {
  static const Command c{
      "infer",
      cmd_infer,
      {{"",
        "infer --checkpoint PATH [--checkpoint PATH2 ...] --input SCAN|DIR|DATASET --output PATH "
        "[--device D] [--format nifti|seg] [--class-names bg,liver,...] [--amp A] [--quiet] "
        "[--tta none|mirror|mirror-all] [--overlap F] [--stitch-device cpu] [--postprocess FILE|none] "
        "[--channels-last on|off] [--save-probabilities]\n"
        "infer --model MODEL_DIR --input ... --output ... [--no-postprocess] [common options]\n"
        "infer --checkpoint SAM.pt --input SCAN|DIR --output PATH (--boxes FILE | --boxes-from LABELMAP) "
        "[--propagate] [--box-margin N] [common options]",
        "sliding-window inference with a checkpoint, an ensemble or a package; box prompts with a sam one",
        "Writes label maps in each input's geometry, one per case into a folder, and prints one JSON object "
        "(docs/how-to/train-and-infer.md). With box prompts (a sam checkpoint) the sliding-window options "
        "are refused; a folder input takes a folder of prompts, one per case (docs/how-to/box-prompted.md).",
        {},
        {{"", kInferOptions},
         {"sliding window (not with box prompts)", kSlidingWindowOptions},
         {"model package", kPackageInferOptions},
         {"box prompts (a sam checkpoint)", box_prompt_options()}}}}};
  return c;
}

int cmd_infer(int argc, char** argv) {
  auto a = parse_args(argc, argv, 2, infer_command().forms.front());
  if (!a.is_ok()) return fail("infer", a.status());
  for (const char* k : {"checkpoint", "input", "output"})
    if (!a->has(k) && !(a->has("model") && k == std::string("checkpoint")))
      return fail("infer",
                  invalid_argument(std::string("--") + k + ": required" +
                                   (k == std::string("checkpoint") ? " (or --model MODEL_DIR)" : "")));
  if (!a->positional.empty())
    return fail("infer", invalid_argument("unexpected argument '" + a->positional.front() + "'"));
  if (wants_box_inference(*a)) return infer_with_boxes(*a);  // box-prompted (SAM) checkpoints
  models::InferOptions o;
  if (Status st = model_package_options(*a, o); !st.is_ok()) return fail("infer", st);
  const auto checkpoints = a->all("checkpoint");
  if (o.model.empty()) o.checkpoint = checkpoints.front();
  if (o.model.empty()) o.ensemble.assign(checkpoints.begin() + 1, checkpoints.end());
  o.input = a->get("input");
  o.output = a->get("output");
  o.device = a->get("device", "auto");
  o.save_probabilities = a->flag("save-probabilities");
  auto tta = models::parse_tta(a->get("tta", "none"));
  if (!tta.is_ok()) return fail("infer", tta.status());
  o.tta = *tta;
  if (a->has("class-names")) o.class_names = split_text(a->get("class-names"), ',');
  o.format = a->get("format");
  o.amp = a->get("amp");
  if (a->has("channels-last")) {
    const std::string v = a->get("channels-last");
    if (v != "on" && v != "off")
      return fail("infer", invalid_argument("--channels-last: expected on or off, got '" + v + "'"));
    o.channels_last = v == "on";
  }
  if (a->has("overlap")) {
    const std::string v = a->get("overlap");
    char* end = nullptr;
    o.overlap = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !(o.overlap >= 0.0 && o.overlap < 1.0))
      return fail("infer", invalid_argument("--overlap: expected a number in [0, 1), got '" + v + "'"));
  }
  o.stitch_device = a->get("stitch-device");
  if (!o.format.empty() && o.format != "nifti" && o.format != "seg")
    return fail("infer", invalid_argument("--format: expected nifti or seg, got '" + o.format + "'"));
  auto plan = postprocess_plan(*a, o);
  if (!plan.is_ok()) return fail("infer", plan.status());

  if (models::is_single_scan(o.input)) {
    auto r = models::run_inference(o);
    if (!r.is_ok()) return fail("infer", r.status());
    if (Status st = postprocess_output(*r, *plan); !st.is_ok()) return fail("infer", st);
    std::cout << result_json(*r).dump() << '\n';
    return 0;
  }
  ProgressBar bar(a->flag("quiet"));
  auto r = models::run_inference_batch(o, [&](const models::InferProgress& p) { bar(p); });
  if (!r.is_ok()) return fail("infer", r.status());
  for (auto& c : r->outputs)
    if (Status st = postprocess_output(c, *plan); !st.is_ok()) return fail("infer", st);
  nlohmann::json j = {{"cases", nlohmann::json::array()},
                      {"failed", nlohmann::json::array()},
                      {"skipped", nlohmann::json::array()},
                      {"seconds", r->seconds}};
  for (const auto& c : r->outputs) j["cases"].push_back(result_json(c));
  for (const auto& [id, err] : r->failed) j["failed"].push_back({{"case", id}, {"error", err}});
  for (const auto& [path, why] : r->skipped) {
    j["skipped"].push_back({{"path", path}, {"reason", why}});
    std::fprintf(stderr, "segflow infer: skipped %s: %s\n", path.c_str(), why.c_str());
  }
  std::cout << j.dump() << '\n';
  if (!r->failed.empty()) {
    std::fprintf(stderr, "segflow infer: %zu of %zu cases failed; first: %s: %s\n", r->failed.size(),
                 r->failed.size() + r->outputs.size(), r->failed.front().first.c_str(),
                 r->failed.front().second.c_str());
    return 1;
  }
  return 0;
}

}  // namespace segflow::apps
