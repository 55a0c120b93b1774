#pragma once
// The "map_labels" stage: selects, merges and renumbers the values of a label map, e.g. to
// train on spleen, liver and kidneys of TotalSegmentator's 117-class maps. Deterministic
// (cached). Options are either a mapping {source: target} or a list `keep` of source labels
// renumbered 1..n in the listed order; every value not listed becomes 0 (background).
//
//   - name: map_labels
//     options: {keep: [1, 5, 2, 3], names: [background, spleen, liver, kidney_right, kidney_left]}
//   - name: map_labels
//     options: {mapping: {1: 1, 5: 2, 2: 3, 3: 3}}   # kidneys merged into class 3
//
// A source label that does not occur in a case is logged as a warning, once per label for
// the life of the stage (one job); label maps that are all background report nothing.

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "messages/status.hpp"
#include "pipeline/fwd.hpp"

namespace segflow::pipeline {

/// Options of stage "map_labels": `mapping` or `keep` (not both); with neither (the default)
/// the labels are unchanged.
struct MapLabelsOptions {
  std::string key = "label";                          ///< the label map tensor (integer values)
  nlohmann::json mapping = nlohmann::json::object();  ///< {source: target}, label values >= 0
  std::vector<std::int64_t> keep;                     ///< source labels kept as 1..n, in this order
  std::vector<std::string> names;   ///< names of the target classes 0..n (background first); empty = derived
  bool allow_missing_keys = false;  ///< pass samples without `key` through (e.g. inference)
  /// The validated pairs (source, target), in the config's order; filled by bind().
  std::vector<std::pair<std::int64_t, std::int64_t>> pairs;
  void bind(OptionParser& p);
};

/// Parses and validates map_labels options as the stage factory does (for callers that check
/// a job before building it, or derive class names from it). `where` names the options.
Result<MapLabelsOptions> parse_map_labels_options(const nlohmann::json& options, const std::string& where);

/// Number of classes after the mapping, background included: the largest target + 1; 0 when
/// the options map nothing (labels unchanged).
std::int64_t map_labels_num_classes(const MapLabelsOptions& o);

/// Names of the classes 0..n after the mapping: `o.names` when given; else background, then
/// each target named by its sources' names (`source_names`, index = source value) joined with
/// "+" (`source_names` themselves when the options map nothing). Empty when neither `o.names`
/// nor any source name is known.
std::vector<std::string> map_labels_class_names(const MapLabelsOptions& o,
                                                const std::vector<std::string>& source_names);

/// The kernel: a new tensor of `labels`' dtype and shape where each voxel holding a source
/// value holds its target and every other voxel 0. `absent` (when given) receives the sources
/// that occur in no voxel (none when the map is all background, as the empty maps inference
/// feeds through the stages are). Errors for a floating or negative label map and for targets
/// that do not fit the dtype.
Result<at::Tensor> map_label_values(const at::Tensor& labels,
                                    const std::vector<std::pair<std::int64_t, std::int64_t>>& pairs,
                                    std::vector<std::int64_t>* absent = nullptr);

}  // namespace segflow::pipeline
