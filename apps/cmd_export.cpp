// segflow export: a trained checkpoint out to PyTorch (models/export.hpp).
#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>

#include "apps/cli_args.hpp"
#include "apps/commands.hpp"
#include "models/export.hpp"
#include "models/trainer.hpp"

namespace segflow::apps {

int cmd_export(int argc, char** argv) {
  static constexpr const char* kUsage = "usage: segflow export --checkpoint best.pt --to pytorch OUT.pt";
  auto a = parse_args(argc, argv, 2, {"checkpoint", "to"}, {});
  if (!a.is_ok()) return fail("export", a.status());
  for (const char* k : {"checkpoint", "to"})
    if (!a->has(k))
      return fail("export", invalid_argument(std::string("--") + k + ": required (" + kUsage + ")"));
  if (a->get("to") != "pytorch")
    return fail("export", invalid_argument("--to: expected pytorch, got '" + a->get("to") + "'"));
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

}  // namespace segflow::apps
