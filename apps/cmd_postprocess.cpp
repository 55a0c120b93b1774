// segflow postprocess: determine the postprocessing on the folds' out-of-fold predictions,
// or apply a postprocessing.json to label maps (models/evidence/postprocessing.hpp).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <iostream>

#include "apps/cli_args.hpp"
#include "apps/commands.hpp"
#include "messages/file_util.hpp"
#include "models/evidence/postprocessing.hpp"
#include "pipeline/io/image_io.hpp"

namespace segflow::apps {

namespace fs = std::filesystem;

namespace {

constexpr const char* kPostprocessUsage =
    "usage: segflow postprocess determine RUN... [--out postprocessing.json] [--metric dice|iou|nsd] "
    "[--min-voxels 10,50,100,500,1000|none] [--quiet] | segflow postprocess apply --plan postprocessing.json "
    "--input PRED|DIR --output OUT|DIR";

Result<std::vector<std::int64_t>> parse_grid(const std::string& text) {
  std::vector<std::int64_t> grid;
  if (text == "none") return grid;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t end = std::min(text.find(',', start), text.size());
    auto n = parse_int("--min-voxels", text.substr(start, end - start));
    if (!n.is_ok()) return n.status();
    if (*n < 1) return invalid_argument("--min-voxels: expected sizes >= 1, got " + std::to_string(*n));
    grid.push_back(*n);
    start = end + 1;
  }
  return grid;
}

constexpr Option kDetermineOptions[] = {
    {"out", "FILE", "where the plan is written (also printed as one JSON line); default postprocessing.json"},
    {"metric", "dice|iou|nsd",
     "the figure a step must raise: the mean over classes of dice (default), iou or nsd"},
    {"min-voxels", "10,50,100,500,1000|none",
     "sizes tried for the per-class removal of small components (default 10,50,100,500,1000); none skips "
     "that step"},
    {"scratch", "DIR", "where candidate label maps are written to be scored; default a temporary folder"},
    {"quiet", "", "no line per step on stderr"},
};
constexpr Option kApplyOptions[] = {
    {"plan", "FILE", "a postprocessing.json; required"},
    {"input", "PRED|DIR", "a label file, or a folder of them; required"},
    {"output", "OUT|DIR", "the file to write, or a folder (same names as the input's); required"},
};

const Form& determine_form() {
  static const Form f{"determine",
                      "postprocess determine RUN... [--out postprocessing.json] [--metric dice|iou|nsd] "
                      "[--min-voxels 10,50,100,500,1000|none] [--scratch DIR] [--quiet]",
                      "choose the postprocessing on the folds' out-of-fold predictions",
                      "Keeps each of: the largest component of all foreground, per class the largest "
                      "component, per class the removal of small components, only if it raises the metric "
                      "(nnU-Net's rule; docs/how-to/cross-validation.md).",
                      {{"RUN...", "the run folders of the folds (each with its validation/ predictions)"}},
                      {{"", kDetermineOptions}}};
  return f;
}

const Form& apply_form() {
  static const Form f{"apply",
                      "postprocess apply --plan postprocessing.json --input PRED|DIR --output OUT|DIR",
                      "apply a postprocessing.json to label maps",
                      "",
                      {},
                      {{"", kApplyOptions}}};
  return f;
}

int postprocess_determine(int argc, char** argv) {
  auto a = parse_args(argc, argv, 3, determine_form());
  if (!a.is_ok()) return fail("postprocess", a.status());
  models::DetermineOptions o;
  for (const auto& p : a->positional) o.runs.emplace_back(p);
  if (o.runs.empty())
    return fail("postprocess",
                invalid_argument(std::string("expected run folders (") + kPostprocessUsage + ")"));
  auto m = models::postprocess_metric_from_string(a->get("metric", "dice"));
  if (!m.is_ok()) return fail("postprocess", invalid_argument("--" + m.status().message()));
  o.metric = *m;
  if (a->has("min-voxels")) {
    auto g = parse_grid(a->get("min-voxels"));
    if (!g.is_ok()) return fail("postprocess", g.status());
    o.min_voxels_grid = *g;
  }
  o.scratch = a->get("scratch");
  if (!a->flag("quiet"))
    o.note = [](const std::string& line) { std::fprintf(stderr, "segflow postprocess: %s\n", line.c_str()); };
  auto plan = models::determine_postprocessing(o);
  if (!plan.is_ok()) return fail("postprocess", plan.status());
  const fs::path out = a->get("out", "postprocessing.json");
  const std::string text = models::postprocessing_json(*plan).dump(2) + "\n";
  if (Status st = write_file_atomically(out, text); !st.is_ok()) return fail("postprocess", st);
  std::cout << models::postprocessing_json(*plan).dump() << '\n';
  return 0;
}

/// The label files of a folder (volume files by name), sorted.
std::vector<fs::path> label_files(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && pipeline::is_volume_path(e.path())) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

int postprocess_apply(int argc, char** argv) {
  auto a = parse_args(argc, argv, 3, apply_form());
  if (!a.is_ok()) return fail("postprocess", a.status());
  for (const char* k : {"plan", "input", "output"})
    if (!a->has(k))
      return fail("postprocess",
                  invalid_argument(std::string("--") + k + ": required (" + kPostprocessUsage + ")"));
  auto plan = models::read_postprocessing(a->get("plan"));
  if (!plan.is_ok()) return fail("postprocess", plan.status());
  const fs::path in = a->get("input"), out = a->get("output");
  std::error_code ec;
  if (!fs::exists(in, ec))
    return fail("postprocess", not_found("--input " + in.string() + ": no such file or folder"));
  std::vector<std::pair<fs::path, fs::path>> jobs;
  if (fs::is_directory(in, ec)) {
    fs::create_directories(out, ec);
    if (ec)
      return fail("postprocess",
                  io_error("--output " + out.string() + ": cannot create the folder: " + ec.message()));
    for (const auto& f : label_files(in)) jobs.emplace_back(f, out / f.filename());
    if (jobs.empty())
      return fail("postprocess", not_found("--input " + in.string() + ": no label files in the folder"));
  } else {
    jobs.emplace_back(in, out);
  }
  nlohmann::json written = nlohmann::json::array();
  for (const auto& [from, to] : jobs) {
    if (Status st = models::apply_postprocessing_file(from, to, *plan); !st.is_ok())
      return fail("postprocess", st);
    written.push_back(to.string());
  }
  std::cout << nlohmann::json{{"written", written}}.dump() << '\n';
  return 0;
}

}  // namespace

const Command& postprocess_command() {
  static const Command c{"postprocess", cmd_postprocess, {determine_form(), apply_form()}};
  return c;
}

int cmd_postprocess(int argc, char** argv) {
  const std::string sub = argc > 2 ? argv[2] : "";
  if (sub == "determine") return postprocess_determine(argc, argv);
  if (sub == "apply") return postprocess_apply(argc, argv);
  return fail("postprocess",
              invalid_argument("expected determine or apply, got '" + sub + "' (" + kPostprocessUsage + ")"));
}

}  // namespace segflow::apps
