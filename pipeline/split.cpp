#include "pipeline/split.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "messages/file_util.hpp"
#include "pipeline/stage.hpp"

namespace segflow::pipeline {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

/// The seeded Fisher-Yates permutation of 0..n-1 that every split of a job uses.
std::vector<std::size_t> seeded_order(std::size_t n, std::uint64_t seed) {
  Rng rng(mix_seed({seed, 0x5711}));
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  for (auto i = static_cast<std::int64_t>(n) - 1; i > 0; --i) std::swap(order[i], order[rng.integer(0, i)]);
  return order;
}

}  // namespace

Result<std::vector<FoldIds>> cross_validation_folds(std::vector<std::string> ids, std::int64_t folds,
                                                    std::uint64_t seed) {
  const auto n = static_cast<std::int64_t>(ids.size());
  if (folds < 2 || folds > n)
    return invalid_argument("cross-validation: expected 2 to " + std::to_string(n) + " folds for " +
                            std::to_string(n) + " cases, got " + std::to_string(folds));
  std::sort(ids.begin(), ids.end());
  const std::vector<std::size_t> order = seeded_order(ids.size(), seed);
  std::vector<std::int64_t> part(ids.size(), 0);  // the fold whose validation part holds case i
  for (std::int64_t k = 0, at = 0; k < folds; ++k) {
    const std::int64_t size = n / folds + (k < n % folds ? 1 : 0);
    for (std::int64_t j = 0; j < size; ++j) part[order[static_cast<std::size_t>(at + j)]] = k;
    at += size;
  }
  std::vector<FoldIds> table(static_cast<std::size_t>(folds));
  for (std::size_t i = 0; i < ids.size(); ++i)
    for (std::int64_t k = 0; k < folds; ++k) (part[i] == k ? table[k].val : table[k].train).push_back(ids[i]);
  return table;
}

Result<Split> make_split(const std::vector<CaseEntry>& cases, const SplitOptions& o) {
  std::vector<CaseEntry> sorted = cases;
  std::sort(sorted.begin(), sorted.end(), [](auto& a, auto& b) { return a.id < b.id; });
  const auto n = static_cast<std::int64_t>(sorted.size());
  Split s;
  if (o.fold >= 0) {
    std::vector<std::string> ids;
    for (const auto& c : sorted) ids.push_back(c.id);
    auto table = cross_validation_folds(ids, o.folds, o.seed);
    if (!table.is_ok())
      return invalid_config((o.source.empty() ? std::string("config") : o.source) +
                            ": data.folds: expected at most the " + std::to_string(n) + " cases of " +
                            o.root + " (each fold validates on one case at least), got " +
                            std::to_string(o.folds));
    const FoldIds& mine = (*table)[static_cast<std::size_t>(o.fold)];
    for (const auto& c : sorted)
      (std::binary_search(mine.val.begin(), mine.val.end(), c.id) ? s.val : s.train).push_back(c);
    s.fold = o.fold;
    s.folds = std::move(*table);
    return s;
  }
  std::int64_t nval = o.val_cases >= 0 ? o.val_cases : std::llround(o.val_fraction * static_cast<double>(n));
  if (o.val_cases < 0 && o.val_fraction > 0 && n > 1) nval = std::max<std::int64_t>(nval, 1);
  nval = std::min(nval, std::max<std::int64_t>(0, n - 1));
  // Seeded Fisher-Yates over the sorted ids.
  const std::vector<std::size_t> order = seeded_order(sorted.size(), o.seed);
  std::vector<bool> is_val(sorted.size(), false);
  for (std::int64_t i = 0; i < nval; ++i) is_val[order[i]] = true;
  for (std::size_t i = 0; i < sorted.size(); ++i) (is_val[i] ? s.val : s.train).push_back(sorted[i]);
  return s;
}

Split split_cases(const std::vector<CaseEntry>& cases, const SplitOptions& o) {
  auto s = make_split(cases, o);
  return s.is_ok() ? std::move(*s) : Split{};
}

Status write_split(const fs::path& run_dir, const Split& split) {
  json j = {{"train", json::array()}, {"val", json::array()}};
  for (const auto& c : split.train) j["train"].push_back(c.id);
  for (const auto& c : split.val) j["val"].push_back(c.id);
  if (split.fold >= 0) {
    j["fold"] = split.fold;
    j["folds"] = split.folds.size();
    json table = json::array();
    for (const auto& f : split.folds) table.push_back({{"train", f.train}, {"val", f.val}});
    SEGFLOW_RETURN_IF_ERROR(write_file_atomically(run_dir / "splits.json", table.dump(2) + '\n'));
  }
  return write_file_atomically(run_dir / "split.json", j.dump(2) + '\n');
}

}  // namespace segflow::pipeline
