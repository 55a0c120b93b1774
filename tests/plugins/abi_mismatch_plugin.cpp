// A plugin built against another ABI version: must be refused before registering anything.
#include "pipeline/plugin.hpp"

extern "C" __attribute__((visibility("default"))) int segflow_plugin_abi_version() { return 999; }
SEGFLOW_PLUGIN_REGISTER(registry) { return 0; }
