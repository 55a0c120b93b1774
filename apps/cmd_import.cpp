// segflow import --from nnunet RESULTS_DIR/fold_K --out DIR: an nnU-Net v2 model as a segflow
// checkpoint and job config (models/nnunet_export.hpp import_nnunet).
#include <nlohmann/json.hpp>

#include <iostream>

#include "apps/cli_args.hpp"
#include "apps/commands.hpp"
#include "models/nnunet_export.hpp"

namespace segflow::apps {

int cmd_import(int argc, char** argv) {
  static constexpr const char* kUsage = "usage: segflow import --from nnunet RESULTS_DIR/fold_K --out DIR";
  auto a = parse_args(argc, argv, 2, {"from", "out"}, {});
  if (!a.is_ok()) return fail("import", a.status());
  for (const char* k : {"from", "out"})
    if (!a->has(k))
      return fail("import", invalid_argument(std::string("--") + k + ": required (" + kUsage + ")"));
  if (a->get("from") != "nnunet")
    return fail("import", invalid_argument("--from: expected nnunet, got '" + a->get("from") + "'"));
  if (a->positional.size() != 1)
    return fail("import", invalid_argument("expected one fold folder RESULTS_DIR/fold_K, got " +
                                           std::to_string(a->positional.size()) + " (" + kUsage + ")"));
  const std::filesystem::path out = a->get("out");
  auto ckpt = models::import_nnunet(a->positional[0], out);
  if (!ckpt.is_ok()) return fail("import", ckpt.status());
  std::cout << nlohmann::json{{"checkpoint", ckpt->string()}, {"config", (out / "job.yaml").string()}}.dump()
            << '\n';
  return 0;
}

}  // namespace segflow::apps
