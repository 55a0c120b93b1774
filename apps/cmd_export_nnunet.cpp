// segflow export --to nnunet (placeholder until the exporter lands: refuses with a clear error).
#include "apps/commands.hpp"

namespace segflow::apps {

int cmd_export_nnunet(int /*argc*/, char** /*argv*/) {
  return fail("export", unsupported("--to nnunet: not available in this build"));
}

}  // namespace segflow::apps
