#pragma once
// How a dataset's cases are divided for training: a seeded hold-out split or one fold of
// nnU-Net's cross-validation table, and the split.json / splits.json files that record it.
// Plain functions, no state; deterministic for a seed.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "messages/status.hpp"
#include "pipeline/io/dataset.hpp"

namespace segflow::pipeline {

/// What a split needs to know (a job config's `seed` and `data` keys).
struct SplitOptions {
  std::uint64_t seed = 0;       ///< shuffles the sorted case ids
  double val_fraction = 0.2;    ///< fraction held out, [0, 1); ignored when val_cases >= 0
  std::int64_t val_cases = -1;  ///< >= 0: the count held out; -1 = use val_fraction
  std::int64_t folds = 5;       ///< cross-validation parts, >= 2 (used when fold >= 0)
  std::int64_t fold = -1;       ///< the fold to train, [0, folds - 1]; -1 = hold-out split
  std::string source;           ///< the config file, for error messages ("config" when empty)
  std::string root;             ///< the dataset folder, for error messages
};

/// The case ids of one cross-validation fold.
struct FoldIds {
  std::vector<std::string> train;
  std::vector<std::string> val;
};

/// The train/validation split of a dataset (deterministic for a seed).
struct Split {
  std::vector<CaseEntry> train;
  std::vector<CaseEntry> val;
  std::int64_t fold = -1;      ///< the cross-validation fold this is; -1 = a val_fraction split
  std::vector<FoldIds> folds;  ///< with fold >= 0: every fold of the table (splits.json)
};

/// nnU-Net's cross-validation table (its generate_crossval_split, sklearn's KFold with
/// shuffling): the ids sorted, shuffled by a Fisher-Yates pass seeded with `seed`, cut in
/// `folds` consecutive parts whose sizes differ by at most one (the first n % folds parts
/// one larger); fold k validates on part k (in sorted order) and trains on the others.
/// The parts partition the ids. Needs 2 <= folds <= ids.size() (invalid_argument otherwise).
Result<std::vector<FoldIds>> cross_validation_folds(std::vector<std::string> ids, std::int64_t folds,
                                                    std::uint64_t seed);

/// Without a fold: holds out val_cases (or round(val_fraction * n), at least 1 when n > 1
/// and the fraction is > 0) chosen by a seeded shuffle of the case ids. With fold = k: fold
/// k of cross_validation_folds(ids, folds, seed), the whole table in `folds`; an
/// invalid_config error naming data.folds when there are fewer cases than folds.
Result<Split> make_split(const std::vector<CaseEntry>& cases, const SplitOptions& options);
/// make_split for options whose folds fit the cases (what a prepared job has checked); with
/// too few cases for the folds it returns an empty split.
Split split_cases(const std::vector<CaseEntry>& cases, const SplitOptions& options);

/// Writes the split to run_dir/split.json ({"train": [ids], "val": [ids]}, like one entry of
/// nnU-Net's splits_final.json, with "fold" and "folds" for a cross-validation fold), so that
/// other tools can train and score on the same cases; for a fold also run_dir/splits.json,
/// the whole table as nnU-Net's splits_final.json: [{"train": [...], "val": [...]}, ...].
Status write_split(const std::filesystem::path& run_dir, const Split& split);

}  // namespace segflow::pipeline
