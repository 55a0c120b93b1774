// segflow package: the chosen checkpoints, their configs, class names, TTA, postprocessing
// and cross-validation figures in one folder with a manifest (models/evidence/packaging.hpp).
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <iostream>

#include "apps/cli_args.hpp"
#include "apps/commands.hpp"
#include "models/evidence/packaging.hpp"

namespace segflow::apps {

namespace {

constexpr const char* kPackageUsage =
    "usage: segflow package --out MODEL_DIR (RUN... | --cv cv_summary.json ... | --selection selection.json) "
    "[--postprocessing postprocessing.json] [--checkpoint last|best] [--tta none|mirror|mirror-all] [--json]";

/// "0.912 [0.880, 0.941]" of a cv interval object, "-" when absent.
std::string interval_text(const nlohmann::json& i) {
  if (!i.is_object() || !i.value("mean", nlohmann::json()).is_number()) return "-";
  char buf[96];
  const auto num = [&](const char* k) {
    return i.value(k, nlohmann::json()).is_number() ? i[k].get<double>() : NAN;
  };
  std::snprintf(buf, sizeof buf, "%.4f [%.4f, %.4f]", num("mean"), num("low"), num("high"));
  return buf;
}

/// What the package holds, for people.
void print_package(const models::ModelPackage& p) {
  const auto& m = p.manifest;
  std::printf("model package %s (%s)\n", p.dir.c_str(), m.value("format", "").c_str());
  std::printf("  members: %zu (%s.pt), family %s, %lld input channel(s), %dD\n", p.members.size(),
              p.checkpoint.c_str(), p.family.c_str(), static_cast<long long>(p.in_channels), p.spatial_dims);
  for (const auto& mem : p.members)
    std::printf("    %s  (fold %lld of %s)\n", mem.checkpoint.c_str(), static_cast<long long>(mem.fold),
                mem.configuration.c_str());
  std::string names;
  for (const auto& c : m["classes"])
    names += (names.empty() ? "" : ", ") + std::to_string(c["label"].get<int>()) + "=" +
             (c["name"].is_string() ? c["name"].get<std::string>() : "?");
  std::printf(
      "  classes: %s\n  tta: %s, overlap: %s\n", names.c_str(), m.value("tta", "").c_str(),
      m["overlap"].is_number() ? std::to_string(m["overlap"].get<double>()).c_str() : "each member's own");
  for (const auto& cv : m["cv"])
    std::printf(
        "  cv (%s): %zu run(s), mean Dice %s\n", cv.value("source", "").c_str(),
        cv.value("runs", nlohmann::json::array()).size(),
        interval_text(cv.value("mean", nlohmann::json::object()).value("dice", nlohmann::json())).c_str());
  if (m["selection"].is_object())
    std::printf("  selection: %s\n", m["selection"].value("statement", "").c_str());
  if (p.postprocessing)
    std::printf("  postprocessing: %s %.4f -> %.4f (mean Dice %.4f -> %.4f)\n",
                models::to_string(p.postprocessing->metric), p.postprocessing->before,
                p.postprocessing->after, p.postprocessing->dice_before, p.postprocessing->dice_after);
  else
    std::printf("  postprocessing: none\n");
  std::printf("  files: %zu with sha256\n", m["files"].size());
}

constexpr Option kPackageOptions[] = {
    {"out", "MODEL_DIR", "the folder to write; must not exist; required"},
    {"cv", "FILE",
     "a `segflow cv --out` summary: its runs are members, its figures recorded; repeat for an ensemble of "
     "configurations"},
    {"selection", "FILE",
     "a `segflow select --out` file: the winner's runs, its summaries' figures and the verdict"},
    {"postprocessing", "FILE",
     "a postprocessing.json for the model's classes, copied in and applied by infer --model"},
    {"checkpoint", "last|best",
     "which checkpoint of each run: last (default; what the out-of-fold figures used) or best"},
    {"tta", "none|mirror|mirror-all", "what infer --model runs; default none"},
    {"json", "", "print model.json instead of a summary"},
    {"quiet", "", "no progress lines on stderr"},
};

}  // namespace

const Command& package_command() {
  static const Command c{
      "package",
      cmd_package,
      {{"",
        "package --out MODEL_DIR (RUN... | --cv cv_summary.json ... | --selection selection.json) "
        "[--postprocessing postprocessing.json] [--checkpoint last|best] [--tta none|mirror|mirror-all] "
        "[--json] [--quiet]",
        "the chosen checkpoints, class names, TTA, postprocessing and CV figures in one model folder",
        "A manifest (model.json) and the sha256 of every file; segflow infer --model runs it "
        "(docs/how-to/from-folds-to-model.md).",
        {{"RUN...", "run folders, one per fold (their cv figures computed when each has validation/)"}},
        {{"", kPackageOptions}}}}};
  return c;
}

int cmd_package(int argc, char** argv) {
  auto a = parse_args(argc, argv, 2, package_command().forms.front());
  if (!a.is_ok()) return fail("package", a.status());
  if (!a->has("out"))
    return fail("package", invalid_argument(std::string("--out: required (") + kPackageUsage + ")"));
  models::PackageOptions o;
  o.out = a->get("out");
  for (const auto& p : a->positional) o.runs.emplace_back(p);
  for (const auto& p : a->all("cv")) o.cv.emplace_back(p);
  o.selection = a->get("selection");
  o.postprocessing = a->get("postprocessing");
  o.checkpoint = a->get("checkpoint", "last");
  auto tta = models::parse_tta(a->get("tta", "none"));
  if (!tta.is_ok()) return fail("package", tta.status());
  o.tta = *tta;
  if (o.runs.empty() && o.cv.empty() && o.selection.empty())
    return fail("package", invalid_argument(std::string("expected run folders, --cv or --selection (") +
                                            kPackageUsage + ")"));
  if (!a->flag("quiet"))
    o.note = [](const std::string& line) { std::fprintf(stderr, "segflow package: %s\n", line.c_str()); };
  auto p = models::write_model_package(o);
  if (!p.is_ok()) return fail("package", p.status());
  if (a->flag("json"))
    std::cout << p->manifest.dump() << '\n';
  else
    print_package(*p);
  return 0;
}

}  // namespace segflow::apps
