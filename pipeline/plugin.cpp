#include "pipeline/plugin.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <set>
#include <system_error>

#include "pipeline/stage_registry.hpp"

namespace segflow::pipeline {

namespace fs = std::filesystem;

Result<LoadedPlugin> load_plugin(const fs::path& file, StageRegistry& registry) {
  const std::string name = file.string();
  std::error_code ec;
  if (!fs::exists(file, ec)) return not_found(name + ": no such plugin file");
  dlerror();
  void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* e = dlerror();
    return io_error(name + ": dlopen failed: " + (e ? e : "unknown error"));
  }
  // From here on the library stays loaded: even a failed one may have run constructors.
  auto abi = reinterpret_cast<PluginAbiFn>(dlsym(handle, kPluginAbiSymbol));
  auto reg = reinterpret_cast<PluginRegisterFn>(dlsym(handle, kPluginRegisterSymbol));
  if (!reg)
    return invalid_argument(name + ": not a segflow plugin: no symbol '" + kPluginRegisterSymbol +
                            "' (declare it with SEGFLOW_PLUGIN_REGISTER from pipeline/plugin.hpp)");
  if (!abi)
    return invalid_argument(name + ": no symbol '" + kPluginAbiSymbol +
                            "' (add SEGFLOW_PLUGIN_ABI() from pipeline/plugin.hpp)");
  const int version = abi();
  if (version != kPluginAbiVersion)
    return unsupported(name + ": plugin ABI version " + std::to_string(version) + ", this segflow needs " +
                       std::to_string(kPluginAbiVersion) + "; rebuild the plugin against these headers");

  const auto before_names = registry.names();
  const std::set<std::string> before(before_names.begin(), before_names.end());
  const std::string saved_origin = registry.origin();
  registry.set_origin(name);
  int rc = 0;
  std::string what;
  try {
    rc = reg(&registry);
  } catch (const std::exception& e) {
    rc = -1;
    what = e.what();
  } catch (...) {
    rc = -1;
    what = "unknown exception";
  }
  registry.set_origin(saved_origin);

  LoadedPlugin out;
  out.path = file;
  for (const auto& n : registry.names())
    if (!before.count(n)) out.stages.push_back(n);
  if (rc != 0) {
    for (const auto& n : out.stages) registry.remove(n);
    std::string detail = what.empty() ? registry.last_error() : what;
    return invalid_argument(name + ": " + kPluginRegisterSymbol + " failed (returned " + std::to_string(rc) +
                            ")" + (detail.empty() ? std::string() : ": " + detail));
  }
  return out;
}

Result<std::vector<LoadedPlugin>> load_plugins(const fs::path& folder, StageRegistry& registry) {
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) return not_found(folder.string() + ": no such plugin folder");
  std::vector<fs::path> files;
  for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().extension() == ".so" && !it->is_directory()) files.push_back(it->path());
  if (ec) return io_error(folder.string() + ": cannot list the plugin folder: " + ec.message());
  std::sort(files.begin(), files.end());
  std::vector<LoadedPlugin> out;
  for (const auto& f : files) {
    SEGFLOW_ASSIGN_OR_RETURN(LoadedPlugin p, load_plugin(f, registry));
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace segflow::pipeline
