// segflow export --to onnx: a trained checkpoint (or every member of a model package) as
// ONNX with its preprocessing manifest (models/interop/onnx_export.hpp).
#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>

#include "apps/cli_args.hpp"
#include "apps/commands.hpp"
#include "messages/file_util.hpp"
#include "models/inference/model_package.hpp"
#include "models/interop/onnx/onnx_graph.hpp"
#include "models/interop/onnx_export.hpp"
#include "models/training/class_names.hpp"
#include "models/training/trainer.hpp"

namespace segflow::apps {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kUsage =
    "usage: segflow export --checkpoint best.pt --to onnx OUT.onnx [--opset N] [--fp16-weights]\n"
    "       (a sam checkpoint: OUT.encoder.onnx + OUT.decoder.onnx)\n"
    "       segflow export --model MODEL_DIR --to onnx OUT_DIR [--opset N] [--fp16-weights]";

/// "<dir>/x.onnx" -> "<dir>/x.manifest.json".
fs::path manifest_path(const fs::path& onnx_file) {
  fs::path m = onnx_file;
  m.replace_extension(".manifest.json");
  return m;
}

/// One checkpoint to `out` (.onnx) and its manifest; the manifest's JSON.
Result<json> export_checkpoint(const fs::path& checkpoint, const fs::path& out,
                               const models::OnnxExportOptions& eo) {
  SEGFLOW_ASSIGN_OR_RETURN(auto trainer, models::load_for_inference(checkpoint, "cpu"));
  const auto& t = *trainer;
  t.model().module().eval();
  models::OnnxExportOptions options = eo;
  options.class_names = models::model_class_names(t);
  // The manifest first: a config whose stages cannot be built fails before any file is written.
  SEGFLOW_ASSIGN_OR_RETURN(json manifest, models::onnx_manifest(t.config(), t.model().info(), out, options));
  manifest["checkpoint"] = fs::absolute(checkpoint).string();
  SEGFLOW_RETURN_IF_ERROR(models::write_onnx_model(t.config().model, t.model().module(), out, options));
  if (Status st = write_file_atomically(manifest_path(out), manifest.dump(2) + '\n'); !st.is_ok()) {
    for (const fs::path& f : models::onnx_output_files(t.config().model, out)) fs::remove(f);
    return st;
  }
  return manifest;
}

/// Every member of `package` as <i>-<run>.onnx + manifest into `folder`; their entries for
/// ensemble.json.
Result<json> export_members(const models::ModelPackage& package, const fs::path& dir, const fs::path& folder,
                            const models::OnnxExportOptions& eo) {
  json members = json::array();
  for (std::size_t i = 0; i < package.members.size(); ++i) {
    const auto& m = package.members[i];
    const std::string stem = std::to_string(i) + "-" + m.run;
    auto r = export_checkpoint(package.dir / m.checkpoint, folder / (stem + ".onnx"), eo);
    if (!r.is_ok()) return r.status().with_context(dir.string() + ": member " + std::to_string(i));
    if ((*r)["model"]["family"] == "sam")  // two graphs and box prompts: no ensemble of them
      return unsupported(dir.string() + ": member " + std::to_string(i) +
                         ": a box-prompted sam; export its checkpoint with --checkpoint instead");
    members.push_back(
        {{"onnx", stem + ".onnx"}, {"manifest", stem + ".manifest.json"}, {"run", m.run}, {"fold", m.fold}});
  }
  return members;
}

/// Every member of a package into the new folder `out`: <i>-<run>.onnx + manifests, and
/// ensemble.json with how the members combine (mean of probabilities), the TTA and the
/// package's postprocessing. Written in a temporary folder and renamed (write_folder_atomically).
Status export_package(const fs::path& dir, const fs::path& out, const models::OnnxExportOptions& eo) {
  SEGFLOW_ASSIGN_OR_RETURN(models::ModelPackage package, models::read_model_package(dir));
  if (fs::exists(out))
    return invalid_argument(out.string() + ": already exists (a package exports into a new folder)");
  return write_folder_atomically(out, [&](const fs::path& folder) -> Status {
    SEGFLOW_ASSIGN_OR_RETURN(json members, export_members(package, dir, folder, eo));
    const json& pm = package.manifest;
    const json ensemble = {{"format", "segflow-onnx-ensemble"},
                           {"version", 1},
                           {"package", fs::absolute(dir).string()},
                           {"members", members},
                           {"combine",
                            "mean of the members' probabilities on the first member's preprocessed grid, "
                            "then argmax (as segflow infer --model)"},
                           {"tta", pm.value("tta", json("none"))},
                           {"classes", package.class_names},
                           {"postprocessing", pm.value("postprocessing", json())}};
    SEGFLOW_RETURN_IF_ERROR(write_file_atomically(folder / "ensemble.json", ensemble.dump(2) + '\n'));
    std::error_code ec;
    if (package.postprocessing && pm.value("postprocessing", json()).is_string())
      fs::copy_file(package.dir / pm["postprocessing"].get<std::string>(),
                    folder / pm["postprocessing"].get<std::string>(), ec);
    if (ec) return io_error(dir.string() + ": cannot copy its postprocessing plan: " + ec.message());
    return Status::ok();
  });
}

constexpr Option kExportOnnxOptions[] = {
    {"checkpoint", "FILE",
     "a run's best.pt or last.pt (unet, plain_unet or sam); one of --checkpoint and --model"},
    {"model", "MODEL_DIR",
     "a segflow package: every member into the new folder OUT, with ensemble.json (how they combine, the TTA "
     "and the postprocessing)"},
    {"to", "onnx", "the target: checked ONNX with a preprocessing manifest"},
    {"opset", "N", "the ONNX opset, 13..17; default 17"},
    {"fp16-weights", "", "store the weights as float16 (the graph computes in float32)"},
};

}  // namespace

const Form& export_onnx_form() {
  static const Form f{
      "--to onnx",
      "export --checkpoint best.pt --to onnx OUT.onnx [--opset N] [--fp16-weights]\n"
      "export --model MODEL_DIR "
      "--to onnx OUT_DIR [--opset N] [--fp16-weights]",
      "a unet, plain_unet or sam as checked ONNX with OUT.manifest.json",
      "The manifest holds the preprocessing (the deterministic stages), the sliding window, its blending and "
      "the classes. A sam checkpoint gives OUT.encoder.onnx and OUT.decoder.onnx (docs/how-to/onnx.md).",
      {{"OUT", "the .onnx file to write (the manifest is written beside it), or with --model a new folder"}},
      {{"", kExportOnnxOptions}}};
  return f;
}

int cmd_export_onnx(int argc, char** argv) {
  auto a = parse_args(argc, argv, 2, export_onnx_form());
  if (!a.is_ok()) return fail("export", a.status());
  if (a->has("checkpoint") == a->has("model"))
    return fail("export",
                invalid_argument(std::string("expected one of --checkpoint or --model\n") + kUsage));
  if (a->positional.size() != 1)
    return fail("export", invalid_argument("expected one output, got " +
                                           std::to_string(a->positional.size()) + "\n" + kUsage));
  models::OnnxExportOptions eo;
  eo.fp16_weights = a->flag("fp16-weights");
  if (a->has("opset")) {
    auto v = parse_int("--opset", a->get("opset"));
    if (!v.is_ok()) return fail("export", v.status());
    if (*v < onnx_graph::min_opset() || *v > onnx_graph::max_opset())
      return fail("export",
                  invalid_argument("--opset: expected " + std::to_string(onnx_graph::min_opset()) + ".." +
                                   std::to_string(onnx_graph::max_opset()) + ", got " + a->get("opset")));
    eo.opset = static_cast<int>(*v);
  }
  const fs::path out = a->positional[0];
  if (a->has("model")) {
    if (Status st = export_package(a->get("model"), out, eo); !st.is_ok()) return fail("export", st);
    std::cout << json{{"onnx", out.string()}, {"ensemble", (out / "ensemble.json").string()}}.dump() << '\n';
    return 0;
  }
  if (out.extension() != ".onnx")
    return fail("export", invalid_argument(out.string() +
                                           ": expected a .onnx file (the manifest is written beside it)"));
  auto manifest = export_checkpoint(a->get("checkpoint"), out, eo);
  if (!manifest.is_ok()) return fail("export", manifest.status());
  json printed = {{"onnx", out.string()},
                  {"manifest", manifest_path(out).string()},
                  {"family", (*manifest)["model"]["family"]},
                  {"opset", eo.opset}};
  if (printed["family"] == "sam") {  // two graphs beside the manifest, no OUT.onnx
    printed["onnx"] = json::array();
    for (const char* part : {"encoder", "decoder"})
      printed["onnx"].push_back(
          (out.parent_path() / (*manifest)["model"][part]["file"].get<std::string>()).string());
  }
  std::cout << printed.dump() << '\n';
  return 0;
}

}  // namespace segflow::apps
