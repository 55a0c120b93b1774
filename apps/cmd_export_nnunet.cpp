// segflow export --to nnunet: a plain_unet checkpoint as an nnU-Net v2 results folder
// (models/interop/nnunet_export.hpp) that nnUNetv2_predict / nnUNetPredictor run.
#include <nlohmann/json.hpp>

#include <iostream>
#include <sstream>

#include "apps/cli_args.hpp"
#include "apps/commands.hpp"
#include "models/interop/nnunet_export.hpp"
#include "models/training/class_names.hpp"
#include "models/training/trainer.hpp"

namespace segflow::apps {

namespace {

constexpr const char* kNnunetUsage =
    "usage: segflow export --checkpoint best.pt --to nnunet RESULTS_DIR [--fold K] [--spacing X,Y,Z]";

/// "--spacing 1.5,1.5,2" as (x, y, z) millimetres.
Result<std::array<double, 3>> parse_spacing(const std::string& text) {
  std::array<double, 3> s{};
  std::stringstream in(text);
  std::string part;
  std::size_t n = 0;
  while (std::getline(in, part, ',')) {
    char* end = nullptr;
    const double v = std::strtod(part.c_str(), &end);
    if (n >= 3 || end == part.c_str() || *end != '\0' || !(v > 0))
      return invalid_argument("--spacing: expected three positive numbers X,Y,Z (mm), got '" + text + "'");
    s[n++] = v;
  }
  if (n != 3)
    return invalid_argument("--spacing: expected three positive numbers X,Y,Z (mm), got '" + text + "'");
  return s;
}

constexpr Option kExportNnunetOptions[] = {
    {"checkpoint", "FILE", "a run's best.pt or last.pt of a plain_unet; required"},
    {"to", "nnunet", "the target: an nnU-Net v2 results folder"},
    {"fold", "K", "the fold folder written, fold_K, >= 0; default 0"},
    {"spacing", "X,Y,Z", "the target spacing in mm, for a job without a resample stage"},
};

}  // namespace

const Form& export_nnunet_form() {
  static const Form f{"--to nnunet",
                      "export --checkpoint best.pt --to nnunet RESULTS_DIR [--fold K] [--spacing X,Y,Z]",
                      "a plain_unet as an nnU-Net v2 results folder its predictor runs",
                      "dataset.json, plans.json and fold_K/checkpoint_final.pth; 3D as 3d_fullres, 2D as 2d "
                      "(docs/how-to/export.md).",
                      {{"RESULTS_DIR", "the results folder to write"}},
                      {{"", kExportNnunetOptions}}};
  return f;
}

int cmd_export_nnunet(int argc, char** argv) {
  auto a = parse_args(argc, argv, 2, export_nnunet_form());
  if (!a.is_ok()) return fail("export", a.status());
  if (!a->has("checkpoint"))
    return fail("export", invalid_argument(std::string("--checkpoint: required (") + kNnunetUsage + ")"));
  if (a->positional.size() != 1)
    return fail("export", invalid_argument("expected one results folder RESULTS_DIR, got " +
                                           std::to_string(a->positional.size()) + " (" + kNnunetUsage + ")"));
  models::NnunetExportOptions options;
  options.checkpoint = a->get("checkpoint");
  if (a->has("fold")) {
    auto k = parse_int("--fold", a->get("fold"));
    if (!k.is_ok()) return fail("export", k.status());
    if (*k < 0)
      return fail("export", invalid_argument("--fold: expected an integer >= 0, got " + a->get("fold")));
    options.fold = *k;
  }
  if (a->has("spacing")) {
    auto s = parse_spacing(a->get("spacing"));
    if (!s.is_ok()) return fail("export", s.status());
    options.spacing = *s;
  }
  const std::filesystem::path out = a->positional[0];
  auto trainer = models::load_for_inference(options.checkpoint, "cpu");
  if (!trainer.is_ok()) return fail("export", trainer.status());
  const auto& t = **trainer;
  auto results =
      models::nnunet_results(t.config(), models::model_class_names(t), t.model().module(), options);
  if (!results.is_ok()) return fail("export", results.status());
  if (auto st = models::write_nnunet_results(*results, out); !st.is_ok()) return fail("export", st);
  std::cout
      << nlohmann::json{{"results", out.string()},
                        {"configuration", results->configuration},
                        {"fold", results->fold},
                        {"checkpoint",
                         (out / ("fold_" + std::to_string(results->fold)) / "checkpoint_final.pth").string()},
                        {"notes", results->notes}}
             .dump()
      << '\n';
  return 0;
}

}  // namespace segflow::apps
