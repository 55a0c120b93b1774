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
#include "apps/infer_args.hpp"
#include "apps/infer_boxes.hpp"
#include "models/inference/inference.hpp"
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

/// --model MODEL_DIR (a `segflow package`): its members, TTA and postprocessing replace
/// --checkpoint, --tta and --postprocess; --no-postprocess skips its postprocessing.
Status model_package_flags(const Args& a) {
  if (!a.has("model")) return Status::ok();
  for (const char* k : {"checkpoint", "tta", "postprocess"})
    if (a.has(k))
      return invalid_argument(std::string("--") + k + ": not with --model (the package sets it" +
                              (k == std::string("postprocess") ? "; --no-postprocess skips it)" : ")"));
  return Status::ok();
}

/// The common options: the request's, and --quiet.
std::span<const Option> common_options() {
  static const std::vector<Option> options = [] {
    std::vector<Option> o(infer_flags("").begin(), infer_flags("").end());
    o.push_back({"quiet", "", "no progress lines on stderr"});
    return o;
  }();
  return options;
}

}  // namespace

std::span<const Option> sliding_window_options() {
  return infer_flags("sliding window (not with box prompts)");
}

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
        {{"", common_options()},
         {"sliding window (not with box prompts)", sliding_window_options()},
         {"model package", infer_flags("model package")},
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
  if (Status st = model_package_flags(*a); !st.is_ok()) return fail("infer", st);
  auto request = infer_request_from_args(*a);
  if (!request.is_ok()) return fail("infer", request.status());
  const models::InferOptions o = request->run_options();
  if (request->postprocess.empty() && !o.postprocess_file.empty())
    std::fprintf(stderr, "segflow infer: applying %s (--postprocess none: do not)\n",
                 o.postprocess_file.c_str());

  if (models::is_single_scan(o.input)) {
    auto r = models::run_inference(o);
    if (!r.is_ok()) return fail("infer", r.status());
    std::cout << infer_result_json(*r).dump() << '\n';
    return 0;
  }
  ProgressBar bar(a->flag("quiet"));
  auto r = models::run_inference_batch(o, [&](const models::InferProgress& p) { bar(p); });
  if (!r.is_ok()) return fail("infer", r.status());
  nlohmann::json j = {{"cases", nlohmann::json::array()},
                      {"failed", nlohmann::json::array()},
                      {"skipped", nlohmann::json::array()},
                      {"seconds", r->seconds}};
  for (const auto& c : r->outputs) j["cases"].push_back(infer_result_json(c));
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
