// segflow export: a trained checkpoint out to PyTorch (models/export.hpp), ONNX
// (apps/cmd_export_onnx.cpp) or an nnU-Net v2 results folder (apps/cmd_export_nnunet.cpp).
// Each target parses its own options; this file picks the target from --to.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>

#include "apps/cli_args.hpp"
#include "apps/commands.hpp"
#include "models/export.hpp"
#include "models/trainer.hpp"

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

int export_pytorch(int argc, char** argv) {
  static constexpr const char* kUsage = "usage: segflow export --checkpoint best.pt --to pytorch OUT.pt";
  auto a = parse_args(argc, argv, 2, {"checkpoint", "to"}, {});
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

}  // namespace

int cmd_export(int argc, char** argv) {
  const std::string to = export_target(argc, argv);
  if (to.empty()) return fail("export", invalid_argument("--to: required (pytorch, onnx or nnunet)"));
  if (to == "pytorch") return export_pytorch(argc, argv);
  if (to == "onnx") return cmd_export_onnx(argc, argv);
  if (to == "nnunet") return cmd_export_nnunet(argc, argv);
  return fail("export", invalid_argument("--to: expected pytorch, onnx or nnunet, got '" + to + "'"));
}

}  // namespace segflow::apps
