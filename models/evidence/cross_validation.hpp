#pragma once
// `segflow cv`: the folds of one configuration pooled into one cross-validation summary.
// Each run folder holds its out-of-fold predictions' scores (validation/summary.json,
// written at the end of training: actors/jobs/validation_predictions.hpp); the summary is
// per class the mean Dice, HD95 and NSD over every out-of-fold case with a bootstrap
// confidence interval (cases resampled with replacement, percentile interval), the mean over
// classes likewise, and one row per case.
//
// A case counts for a class when the class is in its prediction or its ground truth (as
// segflow eval's means); HD95 and NSD average their finite values (a class missed by one map
// has no distance) and `missed` counts those cases.

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "messages/status.hpp"

namespace segflow::models {

struct CvOptions {
  std::vector<std::filesystem::path> runs;  ///< run folders, one per fold
  std::int64_t bootstrap = 1000;            ///< resamples, >= 100
  double confidence = 0.95;                 ///< of the interval, in (0, 1)
  std::uint64_t seed = 0;                   ///< of the resampling
};

/// A mean with its bootstrap interval; NaN when no case has a finite value.
struct CvInterval {
  double mean = 0, low = 0, high = 0;
  std::int64_t cases = 0;  ///< cases with a finite value
};

/// One scored out-of-fold case: the run it came from and per class (label -> value; absent
/// when the class is in neither map) Dice, HD95 (NaN: missed) and NSD.
struct CvCase {
  std::string id;
  std::filesystem::path run;
  std::int64_t fold = -1;
  std::map<std::int64_t, double> dice, hd95, nsd;
};

struct CvClass {
  std::int64_t label = 0;  ///< 0 for the mean over classes
  std::string name;
  CvInterval dice, hd95, nsd;
  std::int64_t missed = 0;  ///< cases with the class in one map only
};

struct CvReport {
  std::filesystem::path dataset;
  std::vector<std::filesystem::path> runs;
  std::vector<std::int64_t> folds;
  double confidence = 0.95;
  std::int64_t bootstrap = 0;
  std::vector<CvCase> cases;     ///< by case id
  std::vector<CvClass> classes;  ///< ascending label
  CvClass mean;                  ///< per case the mean over its classes, then as a class
};

/// A mean with its percentile bootstrap interval over `values` (one per case; NaN = no value,
/// left out of the means): `resamples` draws of the cases with replacement from a
/// mt19937_64 seeded with `seed`, so equal seeds and case counts draw the same cases (what
/// makes `segflow select`'s intervals paired).
CvInterval bootstrap_interval(const std::vector<double>& values, std::int64_t resamples, double confidence,
                              std::uint64_t seed);

/// One metric of the cases: per case its value for class `label` (NaN where the case lacks
/// the class), or with label 0 the mean over the case's classes of their finite values.
using CvMetric = std::map<std::int64_t, double> CvCase::*;
std::vector<double> cv_values(const std::vector<CvCase>& cases, CvMetric metric, std::int64_t label);

/// One case of segflow eval's JSON (evaluation_json's "cases" entry) as cv counts it: a class
/// is kept when it is in the prediction or the ground truth; NaN for a missing distance.
/// `names` (may be null) gets the class names the entry carries.
CvCase cv_case_of(const nlohmann::json& evaluated, std::map<std::int64_t, std::string>* names = nullptr);

/// What runs pooled or compared must share: the dataset (canonical path) and the classes
/// (config.json data.num_classes and data.labels, as one text).
struct CvRunIdentity {
  std::string dataset, classes;
};
Result<CvRunIdentity> cv_run_identity(const std::filesystem::path& run);

/// Reads a cv_json file back (`segflow cv --out`'s cv_summary.json): runs, folds, dataset,
/// the cases with their run and scores, confidence and bootstrap; classes and mean are
/// recomputed by the caller. Errors name the file and the field.
Result<CvReport> read_cv_summary(const std::filesystem::path& file);

/// Reads the runs and pools them. Errors name the run and what is wrong: no config.json or
/// validation/summary.json, runs of different datasets or class sets, a case in two runs'
/// validation (two runs of one fold), a bad option.
Result<CvReport> cross_validate(const CvOptions& options);

/// {"dataset", "runs", "folds", "confidence", "bootstrap", "classes": {"1": {name, dice:
/// {mean, low, high, cases}, hd95, nsd, missed}}, "mean": {...}, "cases": [{case, run, fold,
/// dice: {"1": ...}, hd95, nsd}]}; NaN as null.
nlohmann::json cv_json(const CvReport& report);
/// One row per case and class: case,fold,class,name,dice,hd95,nsd (NaN empty).
std::string cv_csv(const CvReport& report);
/// A table: per class and the mean, Dice / HD95 / NSD with their intervals.
std::string cv_text(const CvReport& report);

}  // namespace segflow::models
