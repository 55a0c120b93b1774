#pragma once
// StageRegistry: name-keyed stage factories (Arrow Acero's ExecFactoryRegistry pattern).
// Built-ins register through register_builtin_stages(); plugins through their exported
// segflow_register_stages(). No static-initialiser tricks.
//
// The registry's adding and making functions are inline: plugins call them without linking
// segflow's static libraries. Describing (describe_stages, format_stages) lives in the .cpp.

#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "messages/status.hpp"
#include "pipeline/options.hpp"
#include "pipeline/stage.hpp"

namespace segflow::pipeline {

/// Makes a stage from its options. `where` names the options object for error messages
/// ("configs/job.yaml: stages[2].options"). Must validate everything and read no data.
using StageFactory =
    std::function<Result<std::unique_ptr<Stage>>(const nlohmann::json& options, const std::string& where)>;

/// What `segflow stages` prints about one stage.
struct StageInfo {
  std::string name;                 ///< registry name, [a-z0-9_]+
  std::string doc;                  ///< one line
  bool deterministic = true;        ///< cacheable (no random draws)
  std::vector<OptionInfo> options;  ///< every option with its default
  std::string origin;               ///< "builtin" or the plugin file that registered it
};

/// Name-keyed factories. Not thread-safe while adding; read-only use (make, info) from many
/// threads is fine once registration is over.
class StageRegistry {
 public:
  /// Adds a stage. Errors (invalid_argument) on an empty or duplicate name, listing the
  /// known names and who registered the existing one.
  Status add(StageInfo info, StageFactory factory) {
    if (info.name.empty() || !factory) {
      return remember(Status(ErrorCode::invalid_argument, "stage registration needs a name and a factory"));
    }
    if (info.origin.empty()) info.origin = origin_;
    auto it = entries_.find(info.name);
    if (it != entries_.end()) {
      return remember(Status(ErrorCode::invalid_argument,
                             "stage '" + info.name + "' is already registered (by " + it->second.info.origin +
                                 "); known stages: " + join(names())));
    }
    std::string name = info.name;
    entries_.emplace(std::move(name), Entry{std::move(info), std::move(factory)});
    return Status::ok();
  }

  /// Makes a stage. Unknown name: invalid_config "<where>: unknown stage 'x'; known stages: ...".
  Result<std::unique_ptr<Stage>> make(const std::string& name, const nlohmann::json& options,
                                      const std::string& where) const {
    auto it = entries_.find(name);
    if (it == entries_.end())
      return Status(ErrorCode::invalid_config,
                    (where.empty() ? std::string() : where + ": ") + unknown_stage_message(name));
    return it->second.factory(options, where);
  }

  /// True when `name` is registered.
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  /// Registered names, sorted.
  std::vector<std::string> names() const {
    std::vector<std::string> n;
    for (const auto& [k, v] : entries_) n.push_back(k);
    return n;
  }
  /// Description of a stage, or nullptr.
  const StageInfo* info(const std::string& name) const {
    auto it = entries_.find(name);
    return it == entries_.end() ? nullptr : &it->second.info;
  }
  /// "unknown stage 'x'; known stages: a, b, c".
  std::string unknown_stage_message(const std::string& name) const {
    return "unknown stage '" + name + "'; known stages: " + join(names());
  }

  /// Origin recorded for stages added without one ("builtin" unless a plugin is loading).
  void set_origin(std::string origin) { origin_ = std::move(origin); }
  const std::string& origin() const { return origin_; }
  /// The last error `add` returned (for plugins that can only return an int).
  const std::string& last_error() const { return last_error_; }
  /// Removes a stage (plugin loading rolls back a failed registration). True when removed.
  bool remove(const std::string& name) { return entries_.erase(name) != 0; }

 private:
  struct Entry {
    StageInfo info;
    StageFactory factory;
  };
  Status remember(Status s) {
    last_error_ = s.message();
    return s;
  }
  std::map<std::string, Entry> entries_;
  std::string origin_ = "builtin";
  std::string last_error_;
};

/// Registers stage class `StageT`, which provides:
///   using Options = ...;   // struct with in-place defaults and `void bind(OptionParser&)`
///   static constexpr const char* kName, *kDoc; static constexpr bool kDeterministic;
///   StageT(Options options, nlohmann::json resolved);
/// The options are described by binding a default-constructed Options, so the printed
/// defaults are the struct's own.
template <class StageT>
Status add_stage(StageRegistry& registry) {
  using Options = typename StageT::Options;
  StageInfo info;
  info.name = StageT::kName;
  info.doc = StageT::kDoc;
  info.deterministic = StageT::kDeterministic;
  {
    Options defaults;
    OptionParser p(nlohmann::json::object(), "", StageT::kName);
    defaults.bind(p);
    info.options = p.infos();
  }
  return registry.add(
      std::move(info),
      [](const nlohmann::json& json, const std::string& where) -> Result<std::unique_ptr<Stage>> {
        Options options;
        OptionParser p(json, where, StageT::kName);
        options.bind(p);
        SEGFLOW_RETURN_IF_ERROR(p.finish());
        nlohmann::json resolved = p.resolved();
        return std::unique_ptr<Stage>(std::make_unique<StageT>(std::move(options), std::move(resolved)));
      });
}

/// Registers every built-in stage (the list is in stage_registry.cpp).
Status register_builtin_stages(StageRegistry& registry);

/// A registry with the built-ins registered.
StageRegistry builtin_registry();

/// Every stage with its options: [{name, doc, deterministic, origin, options: [{name, type,
/// default, range, unit, doc}]}], sorted by name.
nlohmann::json describe_stages(const StageRegistry& registry);

/// The same as text for `segflow stages`: one block per stage, one line per option.
std::string format_stages(const StageRegistry& registry);

}  // namespace segflow::pipeline
