#pragma once
// Stage plugins: shared libraries in a plugin folder that register more stages.
//
// A plugin is a shared library (.so) exporting two C functions:
//   extern "C" int segflow_plugin_abi_version();  // returns kPluginAbiVersion it was built with
//   extern "C" int segflow_register_stages(segflow::pipeline::StageRegistry* registry);  // 0 = ok
// Write them with the macros below:
//   SEGFLOW_PLUGIN_ABI()
//   SEGFLOW_PLUGIN_REGISTER(registry) { return segflow::pipeline::add_stage<MyStage>(*registry).is_ok() ? 0 :
//   1; }
//
// ABI: the plugin shares C++ types with the host (Stage, Sample, Rng, StageRegistry,
// OptionParser, LibTorch tensors), so it must be built against the same segflow headers,
// LibTorch and compiler as the host; kPluginAbiVersion changes whenever those headers
// change incompatibly, and a mismatch is refused. The host's static libraries are not
// exported: a plugin may use what is inline in pipeline/stage.hpp, pipeline/options.hpp,
// pipeline/stage_registry.hpp and messages/ headers (plus LibTorch), and link nothing of
// segflow's (build it with -Wl,--no-undefined to check). Loaded libraries stay loaded for
// the life of the process (their stages' code must stay mapped).

#include <filesystem>
#include <string>
#include <vector>

#include "messages/status.hpp"
#include "pipeline/fwd.hpp"

namespace segflow::pipeline {

/// Version of the plugin ABI; bump on any incompatible change of the shared headers.
inline constexpr int kPluginAbiVersion = 1;
/// Symbol of the registration function.
inline constexpr const char* kPluginRegisterSymbol = "segflow_register_stages";
/// Symbol of the ABI version function.
inline constexpr const char* kPluginAbiSymbol = "segflow_plugin_abi_version";

/// Types of the exported functions.
using PluginRegisterFn = int (*)(StageRegistry*);
using PluginAbiFn = int (*)();

/// One loaded plugin.
struct LoadedPlugin {
  std::filesystem::path path;       ///< the library
  std::vector<std::string> stages;  ///< names it registered, sorted
};

/// Loads one plugin and lets it register its stages (their origin is the file's path).
/// Errors name the file: dlopen failures (with dlerror), a missing symbol, an ABI version
/// mismatch, a failing registration (whose stages are then removed again).
Result<LoadedPlugin> load_plugin(const std::filesystem::path& file, StageRegistry& registry);

/// Loads every *.so in `folder` (not recursive), in name order; stops at the first error.
/// A missing folder is not_found; an empty one gives an empty list.
Result<std::vector<LoadedPlugin>> load_plugins(const std::filesystem::path& folder, StageRegistry& registry);

}  // namespace segflow::pipeline

/// Defines segflow_plugin_abi_version() for this plugin.
#define SEGFLOW_PLUGIN_ABI()                                                           \
  extern "C" __attribute__((visibility("default"))) int segflow_plugin_abi_version() { \
    return ::segflow::pipeline::kPluginAbiVersion;                                     \
  }

/// Starts the definition of segflow_register_stages(StageRegistry* registry_name).
#define SEGFLOW_PLUGIN_REGISTER(registry_name)                                   \
  extern "C" __attribute__((visibility("default"))) int segflow_register_stages( \
      ::segflow::pipeline::StageRegistry* registry_name)
