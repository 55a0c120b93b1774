#pragma once
// `segflow select`: the configuration chosen on evidence (nnU-Net's find_best_configuration,
// MONAI's AlgoEnsembleBestN). Each configuration is one cross-validation summary (`segflow
// cv --out`'s cv_summary.json, which names its run folders); every configuration and every
// ensemble of 2..K of them is scored on the same out-of-fold cases, ranked by one metric,
// and the winner is compared with the runner-up.
//
// - A single configuration's per-case figures are its summary's (the folds' own label maps).
// - An ensemble averages its members' saved out-of-fold probabilities
//   (<run>/validation/<case>_probabilities.nii.gz, validation.save_probabilities), resampled
//   linearly onto the first member's grid when the grids differ (a 2D and a 3D plan, models
//   of different families: only the classes must agree), takes the argmax and scores it
//   with segflow eval's code (models/evidence/evaluation.hpp), counted per case as `segflow cv` counts
//   (models/evidence/cross_validation.hpp cv_case_of, cv_values).
// - Every row's interval is cv's percentile bootstrap with one seed: the same resampled
//   cases for every row. The winner and the runner-up are "not distinguishable" when
//   either's mean lies inside the other's interval.

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "messages/status.hpp"
#include "models/evidence/cross_validation.hpp"

namespace segflow::models {

struct SelectOptions {
  std::vector<std::filesystem::path> summaries;  ///< cv_summary.json files, one per configuration
  std::string metric = "dice";                   ///< dice | hd95 (lower is better) | nsd
  std::int64_t label = 0;                        ///< class scored; 0 = the mean over classes
  /// Largest ensemble tried, >= 1 (1: single configurations only); 0 = all configurations.
  std::int64_t max_ensemble = 0;
  std::int64_t bootstrap = 1000;  ///< resamples, >= 100
  double confidence = 0.95;       ///< of the intervals, in (0, 1)
  std::uint64_t seed = 0;         ///< of the resampling
};

/// One configuration: a cv summary and its runs (absolute paths).
struct SelectConfiguration {
  std::string name;  ///< the runs' job name (config.json `name`); the summary's path if two agree
  std::filesystem::path summary;  ///< as given (selection.json writes it absolute)
  std::vector<std::filesystem::path> runs;
  bool probabilities = false;  ///< every out-of-fold case has its probabilities file
};

/// One row: a configuration or an ensemble.
struct SelectCandidate {
  std::string name;                  ///< member names joined with "+"
  std::vector<std::size_t> members;  ///< indices into SelectionReport::configurations
  CvInterval score;
  std::vector<double> values;  ///< per case (SelectionReport::cases order); NaN: no value
};

struct SelectionReport {
  std::string metric;
  std::int64_t label = 0;
  bool higher_is_better = true;
  double confidence = 0.95;
  std::int64_t bootstrap = 0;
  std::uint64_t seed = 0;
  std::string dataset;
  std::vector<std::string> cases;  ///< the out-of-fold case ids, sorted
  std::vector<SelectConfiguration> configurations;
  std::vector<SelectCandidate> ranking;  ///< best first; rows without a value last
  /// Winner vs runner-up: false when either mean lies inside the other's interval (true
  /// with one row).
  bool distinguishable = true;
  std::string statement;  ///< the verdict in words
};

/// Reads the summaries, scores every configuration and ensemble, ranks. Errors name the
/// summaries: unreadable, other datasets or classes, other case sets, a run without
/// probabilities for an ensemble (set validation.save_probabilities), a bad option.
Result<SelectionReport> select_configuration(const SelectOptions& options);

/// selection.json (docs/reference/run-folder.md#selectionjson).
nlohmann::json selection_json(const SelectionReport& report);
/// The ranked table, the winner and the verdict.
std::string selection_text(const SelectionReport& report);

}  // namespace segflow::models
