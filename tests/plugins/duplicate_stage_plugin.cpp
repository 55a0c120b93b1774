// A plugin whose registration fails halfway: it adds "dup_ok", then a stage named "load",
// which the built-ins own. The loader must report the failure and remove "dup_ok" again.
#include "pipeline/plugin.hpp"
#include "pipeline/stage_registry.hpp"

using namespace segflow;
using namespace segflow::pipeline;

SEGFLOW_PLUGIN_ABI()

SEGFLOW_PLUGIN_REGISTER(registry) {
  auto factory = [](const nlohmann::json&, const std::string& where) -> Result<std::unique_ptr<Stage>> {
    return Status(ErrorCode::unsupported, where + ": not buildable");
  };
  StageInfo ok{"dup_ok", "registers fine", true, {}, {}};
  if (!registry->add(ok, factory).is_ok()) return 1;
  StageInfo dup{"load", "collides with the built-in", true, {}, {}};
  return registry->add(dup, factory).is_ok() ? 0 : 2;
}
