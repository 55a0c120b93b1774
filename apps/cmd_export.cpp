// segflow export: a trained checkpoint out to PyTorch (models/interop/export.hpp), ONNX
// (apps/cmd_export_onnx.cpp) or an nnU-Net v2 results folder (apps/cmd_export_nnunet.cpp).
// Each target parses its own options; this file picks the target from --to.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>
#include <iterator>

#include "apps/cli_args.hpp"
#include "apps/commands.hpp"
#include "models/interop/export.hpp"
#include "models/training/trainer.hpp"

namespace segflow::apps {

namespace {

/// The value of --to (or --to=...) in argv[2..], or "" when absent.
std::string export_target(int argc, char** argv) {
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--to" && i + 1 < argc) return argv[i + 1];
    if (arg.rfind("--to=", 0) == 0) return arg.substr(5);
  }
  return {};
}

constexpr Option kExportPytorchOptions[] = {
    {"checkpoint", "FILE", "a run's best.pt or last.pt; required"},
    {"to", "pytorch", "the target: a PyTorch state dict"},
};

const Form& export_pytorch_form() {
  static const Form f{"--to pytorch",
                      "export --checkpoint best.pt --to pytorch OUT.pt",
                      "the trained network as a PyTorch state dict for MONAI's UNet, nnU-Net's PlainConvUNet "
                      "or segment_anything's Sam",
                      "OUT.json beside it holds the network's constructor arguments (docs/how-to/export.md).",
                      {{"OUT.pt", "the state dict to write"}},
                      {{"", kExportPytorchOptions}}};
  return f;
}

int export_pytorch(int argc, char** argv) {
  static constexpr const char* kUsage = "usage: segflow export --checkpoint best.pt --to pytorch OUT.pt";
  auto a = parse_args(argc, argv, 2, export_pytorch_form());
  if (!a.is_ok()) return fail("export", a.status());
  for (const char* k : {"checkpoint", "to"})
    if (!a->has(k))
      return fail("export", invalid_argument(std::string("--") + k + ": required (" + kUsage + ")"));
  if (a->positional.size() != 1)
    return fail("export", invalid_argument("expected one output file OUT.pt, got " +
                                           std::to_string(a->positional.size()) + " (" + kUsage + ")"));
  const std::filesystem::path out = a->positional[0];
  if (out.extension() == ".json")
    return fail("export",
                invalid_argument(out.string() + ": expected a .pt file (the .json is written beside it)"));

  auto trainer = models::load_for_inference(a->get("checkpoint"), "cpu");
  if (!trainer.is_ok()) return fail("export", trainer.status());
  const auto& t = **trainer;
  auto exported = models::export_model(t.config().model, t.model().module());
  if (!exported.is_ok()) return fail("export", exported.status());
  if (auto st = models::write_pytorch_export(*exported, out); !st.is_ok()) return fail("export", st);
  std::filesystem::path spec = out;
  spec.replace_extension(".json");
  std::cout << nlohmann::json{{"target", exported->target},
                              {"tensors", exported->state_dict.size()},
                              {"state_dict", out.string()},
                              {"spec", spec.string()}}
                   .dump()
            << '\n';
  return 0;
}

/// One `--to` target: its form (options and help) and what runs it. Adding a target is a
/// new file and one row here.
struct ExportTarget {
  std::string_view name;
  const Form& (*form)();
  int (*run)(int argc, char** argv);
};

const ExportTarget kExportTargets[] = {
    {"pytorch", export_pytorch_form, export_pytorch},
    {"onnx", export_onnx_form, cmd_export_onnx},
    {"nnunet", export_nnunet_form, cmd_export_nnunet},
};

/// "pytorch, onnx or nnunet".
std::string target_names() {
  std::string names;
  for (std::size_t i = 0; i < std::size(kExportTargets); ++i)
    names += (i == 0                               ? ""
              : i + 1 == std::size(kExportTargets) ? " or "
                                                   : ", ") +
             std::string(kExportTargets[i].name);
  return names;
}

}  // namespace

const Command& export_command() {
  static const Command c = [] {
    Command cmd{"export", cmd_export, {}};
    for (const ExportTarget& t : kExportTargets) cmd.forms.push_back(t.form());
    return cmd;
  }();
  return c;
}

int cmd_export(int argc, char** argv) {
  const std::string to = export_target(argc, argv);
  if (to.empty()) return fail("export", invalid_argument("--to: required (" + target_names() + ")"));
  for (const ExportTarget& t : kExportTargets)
    if (to == t.name) return t.run(argc, argv);
  return fail("export", invalid_argument("--to: expected " + target_names() + ", got '" + to + "'"));
}

}  // namespace segflow::apps
