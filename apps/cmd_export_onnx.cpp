// segflow export --to onnx (placeholder until the exporter lands: refuses with a clear error).
#include "apps/commands.hpp"

namespace segflow::apps {

int cmd_export_onnx(int /*argc*/, char** /*argv*/) {
  return fail("export", unsupported("--to onnx: not available in this build"));
}

}  // namespace segflow::apps
