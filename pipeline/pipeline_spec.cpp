#include "pipeline/pipeline_spec.hpp"

#include <torch/torch.h>
#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cstdlib>
#include <set>

#include "pipeline/io/dataset.hpp"
#include "pipeline/options.hpp"
#include "pipeline/stage_registry.hpp"
#include "pipeline/transforms/load.hpp"

namespace segflow::pipeline {

namespace {

bool parse_integer(const std::string& s, std::int64_t& out) {
  const char* b = s.data();
  const char* e = s.data() + s.size();
  if (b != e && *b == '+') ++b;
  if (b == e) return false;
  auto [p, ec] = std::from_chars(b, e, out);
  return ec == std::errc() && p == e;
}

bool parse_float(const std::string& s, double& out) {
  if (s.empty()) return false;
  bool digit = false;
  for (char c : s) {
    if (c >= '0' && c <= '9')
      digit = true;
    else if (c != '.' && c != 'e' && c != 'E' && c != '+' && c != '-')
      return false;
  }
  if (!digit) return false;
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

std::string place(const std::string& file, const std::string& path) {
  return file.empty() ? path : file + ": " + path;
}

}  // namespace

nlohmann::json yaml_to_json(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      return nullptr;
    case YAML::NodeType::Sequence: {
      nlohmann::json a = nlohmann::json::array();
      for (const auto& e : node) a.push_back(yaml_to_json(e));
      return a;
    }
    case YAML::NodeType::Map: {
      nlohmann::json o = nlohmann::json::object();
      for (const auto& kv : node) o[kv.first.Scalar()] = yaml_to_json(kv.second);
      return o;
    }
    case YAML::NodeType::Scalar:
    default: {
      const std::string& s = node.Scalar();
      const std::string& tag = node.Tag();
      if (tag == "!" || (tag.size() >= 4 && tag.compare(tag.size() - 4, 4, ":str") == 0)) return s;
      if (s == "true" || s == "True" || s == "TRUE") return true;
      if (s == "false" || s == "False" || s == "FALSE") return false;
      if (s == "~" || s == "null" || s == "Null" || s == "NULL") return nullptr;
      std::int64_t i = 0;
      if (parse_integer(s, i)) return i;
      double d = 0;
      if (parse_float(s, d)) return d;
      return s;
    }
  }
}

std::string duplicate_yaml_key(const YAML::Node& node, const std::string& path) {
  if (node.IsSequence()) {
    for (std::size_t i = 0; i < node.size(); ++i)
      if (auto d = duplicate_yaml_key(node[i], path + "[" + std::to_string(i) + "]"); !d.empty()) return d;
  } else if (node.IsMap()) {
    std::set<std::string> seen;
    for (const auto& kv : node) {
      const std::string key = kv.first.Scalar();
      const std::string at = path.empty() ? key : path + "." + key;
      if (!seen.insert(key).second) return at;
      if (auto d = duplicate_yaml_key(kv.second, at); !d.empty()) return d;
    }
  }
  return {};
}

Result<PipelineSpec> parse_pipeline_spec(const nlohmann::json& stages, const std::string& file,
                                         const std::string& path) {
  PipelineSpec spec;
  spec.file = file;
  spec.path = path;
  if (!stages.is_array())
    return invalid_config(place(file, path) + ": expected a list of stages, got " + format_value(stages));
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const std::string at = place(file, path + "[" + std::to_string(i) + "]");
    const nlohmann::json& e = stages[i];
    StageSpec s;
    if (e.is_string()) {
      s.name = e.get<std::string>();
    } else if (e.is_object()) {
      for (auto it = e.begin(); it != e.end(); ++it)
        if (it.key() != "name" && it.key() != "options")
          return invalid_config(at + ": unknown key '" + it.key() + "'; expected name, options");
      auto n = e.find("name");
      if (n == e.end()) return invalid_config(at + ": expected a 'name' (the stage), got " + format_value(e));
      if (!n->is_string() || n->get<std::string>().empty())
        return invalid_config(at + ".name: expected a stage name, got " + format_value(*n));
      s.name = n->get<std::string>();
      auto o = e.find("options");
      if (o != e.end() && !o->is_null()) {
        if (!o->is_object())
          return invalid_config(at + ".options: expected a map of options, got " + format_value(*o));
        s.options = *o;
      }
    } else {
      return invalid_config(at + ": expected a stage name or a map with name and options, got " +
                            format_value(e));
    }
    if (s.name.empty()) return invalid_config(at + ": expected a stage name, got \"\"");
    spec.stages.push_back(std::move(s));
  }
  return spec;
}

Result<PipelineSpec> parse_pipeline_spec(const YAML::Node& stages, const std::string& file,
                                         const std::string& path) {
  if (auto d = duplicate_yaml_key(stages, path); !d.empty())
    return invalid_config(place(file, d) + ": duplicate key; expected each key once");
  return parse_pipeline_spec(yaml_to_json(stages), file, path);
}

nlohmann::json to_json(const PipelineSpec& spec) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& s : spec.stages) a.push_back({{"name", s.name}, {"options", s.options}});
  return a;
}

// ---------------------------------------------------------------------------- Pipeline

Pipeline::Pipeline(std::vector<std::unique_ptr<Stage>> stages) : stages_(std::move(stages)) {
  boundary_ = stages_.size();
  for (std::size_t i = 0; i < stages_.size(); ++i)
    if (!stages_[i]->deterministic()) {
      boundary_ = i;
      break;
    }
}

Status Pipeline::run_range(std::vector<Sample>& samples, Rng& rng, std::size_t begin, std::size_t end) const {
  for (std::size_t i = begin; i < end && i < stages_.size(); ++i) {
    const Stage& st = *stages_[i];
    const std::string at = "stages[" + std::to_string(i) + "] (" + st.name() + ")";
    const std::string sample = samples.empty() ? std::string() : " on sample '" + samples.front().id + "'";
    Status s;
    try {
      s = st.apply(samples, rng);
    } catch (const c10::Error& e) {
      return internal_error(at + sample + ": " + e.what_without_backtrace());
    } catch (const std::exception& e) {
      return internal_error(at + sample + ": " + e.what());
    }
    if (!s.is_ok()) return Status(s.code(), at + ": " + s.message());
  }
  return Status::ok();
}

Result<Sample> Pipeline::run_deterministic(Sample sample) const {
  std::vector<Sample> v;
  v.push_back(std::move(sample));
  Rng unused(0);
  SEGFLOW_RETURN_IF_ERROR(run_range(v, unused, 0, boundary_));
  if (v.size() != 1)
    return internal_error("the deterministic stages made " + std::to_string(v.size()) + " samples from one");
  return std::move(v.front());
}

Result<Sample> Pipeline::run_deterministic(const CaseEntry& entry) const {
  std::size_t first = 0;
  Result<Sample> r = Status(ErrorCode::internal, "not read");
  try {
    const auto* source = stages_.empty() ? nullptr : dynamic_cast<const SourceStage*>(stages_.front().get());
    if (source) {
      r = source->read(entry);
      first = 1;
    } else {
      SEGFLOW_ASSIGN_OR_RETURN(LoadedCase c, load_case(entry));
      r = sample_from_case(std::move(c), LoadOptions{});
    }
  } catch (const c10::Error& e) {
    return internal_error("load: case '" + entry.id + "': " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return internal_error("load: case '" + entry.id + "': " + e.what());
  }
  if (!r.is_ok()) return r.status();
  std::vector<Sample> v;
  v.push_back(std::move(r).value());
  Rng unused(0);
  SEGFLOW_RETURN_IF_ERROR(run_range(v, unused, first, boundary_));
  if (v.size() != 1)
    return internal_error("the deterministic stages made " + std::to_string(v.size()) + " samples from one");
  return std::move(v.front());
}

Status Pipeline::run_random(std::vector<Sample>& samples, Rng& rng) const {
  return run_range(samples, rng, boundary_, stages_.size());
}

Status Pipeline::check_device(const c10::Device& device) const {
  for (std::size_t i = boundary_; i < stages_.size(); ++i)
    if (!stages_[i]->supports_device(device))
      return unsupported("stages[" + std::to_string(i) + "] (" + stages_[i]->name() + ") cannot run on " +
                         device.str());
  return Status::ok();
}

nlohmann::json Pipeline::to_json() const {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& s : stages_) a.push_back({{"name", s->name()}, {"options", s->options()}});
  return a;
}

Result<Pipeline> build_pipeline(const PipelineSpec& spec, const StageRegistry& registry) {
  std::vector<std::unique_ptr<Stage>> stages;
  for (std::size_t i = 0; i < spec.stages.size(); ++i) {
    const StageSpec& s = spec.stages[i];
    const std::string at = place(spec.file, spec.path + "[" + std::to_string(i) + "]");
    if (!registry.contains(s.name))
      return invalid_config(at + ".name: " + registry.unknown_stage_message(s.name));
    SEGFLOW_ASSIGN_OR_RETURN(std::unique_ptr<Stage> stage, registry.make(s.name, s.options, at + ".options"));
    if (!stage) return internal_error(at + ": the factory of stage '" + s.name + "' returned no stage");
    if (i != 0 && dynamic_cast<const SourceStage*>(stage.get()))
      return invalid_config(at + ".name: stage '" + s.name + "' reads the data and must come first");
    stages.push_back(std::move(stage));
  }
  return Pipeline(std::move(stages));
}

Result<Pipeline> build_pipeline(PipelineSpec spec, const StageRegistry& registry, const std::string& file) {
  spec.file = file;
  return build_pipeline(spec, registry);
}

Result<Pipeline> build_pipeline(const YAML::Node& stages, const StageRegistry& registry,
                                const std::string& file, const std::string& path) {
  SEGFLOW_ASSIGN_OR_RETURN(PipelineSpec spec, parse_pipeline_spec(stages, file, path));
  return build_pipeline(spec, registry);
}

}  // namespace segflow::pipeline
