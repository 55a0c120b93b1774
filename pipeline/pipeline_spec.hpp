#pragma once
// A job's pipeline as data (a list of {stage name, options}, Acero's Declaration::Sequence),
// parsed from the job's YAML (or JSON), and the Pipeline built from it by calling every
// factory. Building validates every stage and option at job submission, before any data is
// read.
//
// YAML form (under the job config's `stages:` key):
//   stages:
//     - load
//     - name: resample
//       options: {spacing: [1.5, 1.5, 2.0]}
//     - {name: rand_flip, options: {prob: 0.5}}

#include <nlohmann/json.hpp>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "messages/sample.hpp"
#include "messages/status.hpp"
#include "pipeline/fwd.hpp"
#include "pipeline/stage.hpp"

namespace YAML {
class Node;
}

namespace segflow::pipeline {

/// One entry of a pipeline spec.
struct StageSpec {
  std::string name;                                   ///< registry name
  nlohmann::json options = nlohmann::json::object();  ///< as written (not yet validated)
};

/// A pipeline as data.
struct PipelineSpec {
  std::vector<StageSpec> stages;
  std::string file;             ///< config file it came from (for messages); may be empty
  std::string path = "stages";  ///< where the list sits in that file
};

/// Converts YAML to JSON: plain scalars become null/bool/integer/float when they read as
/// such (true/false, ~/null, 12, -3, 1.5, 1e-3), quoted scalars stay strings.
nlohmann::json yaml_to_json(const YAML::Node& node);

/// The place of the first key that appears twice in one mapping of `node`, e.g.
/// "stages[1].options.mapping.1" (YAML forbids repeated keys, yaml-cpp keeps them and
/// yaml_to_json would keep only the last); empty when every key is unique.
std::string duplicate_yaml_key(const YAML::Node& node, const std::string& path = "");

/// Parses a list of stages (see the header comment). Errors name the file and the entry:
/// "configs/job.yaml: stages[1]: unknown key 'opts'; expected name, options".
/// `path` is where `stages` sits in the file ("stages", "train.stages", ...).
Result<PipelineSpec> parse_pipeline_spec(const YAML::Node& stages, const std::string& file,
                                         const std::string& path = "stages");
/// The same from JSON (an array of names or {name, options} objects).
Result<PipelineSpec> parse_pipeline_spec(const nlohmann::json& stages, const std::string& file,
                                         const std::string& path = "stages");
/// The spec as JSON: [{name, options}, ...].
nlohmann::json to_json(const PipelineSpec& spec);

/// A built pipeline: validated stages, split at the cache boundary. Read-only after
/// building; the run functions are const and thread-safe (one Rng per caller).
class Pipeline {
 public:
  Pipeline() = default;
  explicit Pipeline(std::vector<std::unique_ptr<Stage>> stages);
  Pipeline(Pipeline&&) noexcept = default;
  Pipeline& operator=(Pipeline&&) noexcept = default;

  const std::vector<std::unique_ptr<Stage>>& stages() const { return stages_; }
  std::size_t size() const { return stages_.size(); }

  /// Index of the first random stage (== size() when all are deterministic). Stages before
  /// it run once per case and may be cached; the rest run every epoch.
  std::size_t cache_boundary() const { return boundary_; }

  /// Runs the deterministic part [0, cache_boundary) on a sample that already holds tensors
  /// (a leading "load" stage passes such samples through).
  Result<Sample> run_deterministic(Sample sample) const;
  /// Reads a case with the leading "load" stage (or default load options when the pipeline
  /// has none), then runs the rest of the deterministic part.
  Result<Sample> run_deterministic(const CaseEntry& entry) const;
  /// Runs the random part [cache_boundary, size) on `samples` (usually one cached sample),
  /// drawing from `rng` (Rng::for_sample(job seed, rank, epoch, index)). Crops may turn one
  /// sample into several. The input tensors are not modified (the cache stays intact).
  Status run_random(std::vector<Sample>& samples, Rng& rng) const;
  /// Runs stages [begin, end) (errors name the stage and its index, and the sample).
  Status run_range(std::vector<Sample>& samples, Rng& rng, std::size_t begin, std::size_t end) const;

  /// Ok when every random stage can run on `device`; else names the first that cannot.
  Status check_device(const c10::Device& device) const;
  /// The stages with their resolved options: [{name, options}, ...] (for run folders and logs).
  nlohmann::json to_json() const;

 private:
  std::vector<std::unique_ptr<Stage>> stages_;
  std::size_t boundary_ = 0;
};

/// Builds a pipeline by calling every factory: unknown stages and bad options are errors
/// naming the file and the place, e.g.
///   "configs/job.yaml: stages[2].options.spacing: expected 3 positive numbers, got [1.5, 0]"
///   "configs/job.yaml: stages[0].name: unknown stage 'lod'; known stages: load, ..."
/// A "load" stage (a SourceStage) may only come first.
Result<Pipeline> build_pipeline(const PipelineSpec& spec, const StageRegistry& registry);
/// The same with `file` in place of spec.file.
Result<Pipeline> build_pipeline(PipelineSpec spec, const StageRegistry& registry, const std::string& file);
/// Parses and builds in one go (a job config's `stages:` node).
Result<Pipeline> build_pipeline(const YAML::Node& stages, const StageRegistry& registry,
                                const std::string& file, const std::string& path = "stages");

}  // namespace segflow::pipeline
