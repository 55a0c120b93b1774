#include "models/evidence/selection.hpp"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "messages/geometry.hpp"
#include "models/evidence/evaluation.hpp"
#include "models/training/metrics.hpp"
#include "models/training/run_layout.hpp"
#include "pipeline/io/image_io.hpp"
#include "pipeline/io/nifti.hpp"
#include "pipeline/transforms/spatial.hpp"

#include <unistd.h>

namespace segflow::models {

namespace fs = std::filesystem;

namespace {
namespace sel {  // a name of its own: the unity batch shares anonymous namespaces

/// A configuration as read: its summary's cases (sorted by id) and what must agree.
struct Config {
  SelectConfiguration info;
  std::vector<CvCase> cases;
  CvRunIdentity identity;
};

struct MetricInfo {
  const char* name;
  CvMetric member;
  bool higher_is_better;
  const char* title;
};

/// The metrics `--metric` takes.
const std::vector<MetricInfo>& metrics() {
  static const std::vector<MetricInfo> all = {{"dice", &CvCase::dice, true, "Dice"},
                                              {"hd95", &CvCase::hd95, false, "HD95 mm"},
                                              {"nsd", &CvCase::nsd, true, "NSD"}};
  return all;
}

Result<MetricInfo> metric_of(const std::string& name) {
  for (const auto& m : metrics())
    if (name == m.name) return m;
  return invalid_argument("--metric: expected dice, hd95 or nsd, got '" + name + "'");
}

Status check_options(const SelectOptions& o) {
  if (o.summaries.empty())
    return invalid_argument("select: expected one or more cv summaries (cv_summary.json)");
  SEGFLOW_RETURN_IF_ERROR(metric_of(o.metric).status());
  if (o.label < 0)
    return invalid_argument("--class: expected a label value >= 1 or mean, got " + std::to_string(o.label));
  if (o.max_ensemble < 0)
    return invalid_argument("--max-ensemble: expected an integer >= 1, got " +
                            std::to_string(o.max_ensemble));
  if (o.bootstrap < 100)
    return invalid_argument("--bootstrap: expected >= 100 resamples, got " + std::to_string(o.bootstrap));
  if (!(o.confidence > 0 && o.confidence < 1))
    return invalid_argument("--confidence: expected a number in (0, 1), got " + std::to_string(o.confidence));
  return Status::ok();
}

fs::path absolute_path(const fs::path& p) {
  std::error_code ec;
  fs::path a = fs::weakly_canonical(fs::absolute(p, ec), ec);
  return ec ? p : a;
}

fs::path probabilities_file(const fs::path& run, const std::string& id) {
  return RunLayout(run).validation_probabilities(id);
}

/// The job name of a run (config.json `name`), or "" when it has none.
std::string job_name(const fs::path& run) {
  std::ifstream in(RunLayout(run).config());
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  return !j.is_discarded() && j.is_object() && j.contains("name") && j["name"].is_string()
             ? j["name"].get<std::string>()
             : std::string();
}

/// One summary read: its cases sorted, its runs absolute, its identity.
Result<Config> read_config(const fs::path& summary) {
  SEGFLOW_ASSIGN_OR_RETURN(CvReport r, read_cv_summary(summary));
  Config c;
  c.info.summary = summary;
  for (const auto& run : r.runs) c.info.runs.push_back(absolute_path(run));
  std::map<fs::path, fs::path> abs;
  for (std::size_t i = 0; i < r.runs.size(); ++i) abs[r.runs[i]] = c.info.runs[i];
  for (auto& k : r.cases) {
    auto it = abs.find(k.run);
    if (it == abs.end())
      return corrupt_data(summary.string() + ": case " + k.id + ": run " + k.run.string() +
                          " is not among the summary's runs");
    k.run = it->second;
  }
  c.cases = std::move(r.cases);
  std::sort(c.cases.begin(), c.cases.end(), [](const CvCase& a, const CvCase& b) { return a.id < b.id; });
  SEGFLOW_ASSIGN_OR_RETURN(c.identity, cv_run_identity(c.info.runs.front()));
  c.info.name = job_name(c.info.runs.front());
  c.info.probabilities = true;
  std::error_code ec;
  for (const auto& k : c.cases)
    if (!fs::is_regular_file(probabilities_file(k.run, k.id), ec)) c.info.probabilities = false;
  return c;
}

/// The first case id of `a` missing from `b` ("" when none).
std::string first_missing(const std::vector<CvCase>& a, const std::vector<CvCase>& b) {
  std::set<std::string> ids;
  for (const auto& k : b) ids.insert(k.id);
  for (const auto& k : a)
    if (!ids.count(k.id)) return k.id;
  return "";
}

/// Every configuration against the first: the same dataset, classes and out-of-fold cases.
Status check_comparable(const std::vector<Config>& cs) {
  const Config& f = cs.front();
  for (std::size_t i = 1; i < cs.size(); ++i) {
    const Config& c = cs[i];
    const std::string pair = f.info.summary.string() + " and " + c.info.summary.string();
    if (c.identity.dataset != f.identity.dataset)
      return invalid_argument("select: " + pair + " are of different datasets (" + f.identity.dataset + ", " +
                              c.identity.dataset + ")");
    if (c.identity.classes != f.identity.classes)
      return invalid_argument("select: " + pair + " have different classes (" + f.identity.classes + " vs " +
                              c.identity.classes + ")");
    std::string only = first_missing(f.cases, c.cases), where = f.info.summary.string();
    if (only.empty()) only = first_missing(c.cases, f.cases), where = c.info.summary.string();
    if (!only.empty() || c.cases.size() != f.cases.size())
      return invalid_argument(
          "select: " + pair + " cover different out-of-fold cases (" + std::to_string(f.cases.size()) +
          " vs " + std::to_string(c.cases.size()) + " cases; e.g. " + only + " only in " + where +
          "): configurations are compared on the same cases (the same data.folds and seed)");
  }
  return Status::ok();
}

/// Unique names: the job names, or the summaries' paths where two configurations share one.
void name_configs(std::vector<Config>& cs) {
  std::map<std::string, int> count;
  for (const auto& c : cs) ++count[c.info.name];
  for (auto& c : cs)
    if (c.info.name.empty() || count[c.info.name] > 1) c.info.name = c.info.summary.string();
}

/// Every subset of 2..k of n configurations, by size, then lexicographically.
std::vector<std::vector<std::size_t>> ensembles(std::size_t n, std::size_t k) {
  std::vector<std::vector<std::size_t>> out;
  for (std::size_t size = 2; size <= std::min(n, k); ++size) {
    std::vector<bool> pick(n, false);
    std::fill(pick.begin(), pick.begin() + static_cast<std::ptrdiff_t>(size), true);
    do {
      std::vector<std::size_t> s;
      for (std::size_t i = 0; i < n; ++i)
        if (pick[i]) s.push_back(i);
      out.push_back(s);
    } while (std::prev_permutation(pick.begin(), pick.end()));
  }
  return out;
}

Status check_probabilities(const std::vector<Config>& cs) {
  std::error_code ec;
  for (const auto& c : cs)
    for (const auto& k : c.cases)
      if (!fs::is_regular_file(probabilities_file(k.run, k.id), ec))
        return not_found(
            "select: " + c.info.summary.string() + ": " + probabilities_file(k.run, k.id).string() +
            ": no out-of-fold probabilities to ensemble (train the configuration with "
            "validation.save_probabilities: true, or compare single configurations with --max-ensemble 1)");
  return Status::ok();
}

/// The ground truth of every case: the "gt" its run's validation/summary.json scored.
Result<std::map<std::string, fs::path>> ground_truths(const Config& c) {
  std::map<std::string, fs::path> gt;
  for (const auto& run : c.info.runs) {
    const fs::path file = RunLayout(run).validation_summary();
    std::ifstream in(file);
    if (!in) return not_found(file.string() + ": no out-of-fold scores (the run's validation/ is gone)");
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("cases") || !j["cases"].is_array())
      return corrupt_data(file.string() + ": cases: expected segflow eval's scored cases");
    for (const auto& k : j["cases"])
      if (k.is_object() && k.contains("case") && k["case"].is_string() && k.contains("gt") &&
          k["gt"].is_string())
        gt[k["case"].get<std::string>()] = k["gt"].get<std::string>();
  }
  for (const auto& k : c.cases)
    if (!gt.count(k.id))
      return corrupt_data(c.info.summary.string() + ": case " + k.id +
                          ": its run's validation/summary.json names no ground truth for it");
  return gt;
}

/// Each configuration's probabilities of one case, (K, Z, Y, X) float; the class counts agree.
Result<std::vector<pipeline::Image>> read_probabilities(const std::vector<Config>& cs, std::size_t index) {
  std::vector<pipeline::Image> out;
  for (const auto& c : cs) {
    const CvCase& k = c.cases[index];
    const fs::path file = probabilities_file(k.run, k.id);
    SEGFLOW_ASSIGN_OR_RETURN(pipeline::Image p, pipeline::read_image(file));
    if (p.voxels.dim() != 4 || p.voxels.size(0) < 2)
      return corrupt_data(file.string() +
                          ": expected class probabilities (x, y, z, class) with >= 2 classes");
    p.voxels = p.voxels.to(at::kFloat);
    if (!out.empty() && p.voxels.size(0) != out.front().voxels.size(0))
      return invalid_argument(
          "select: " + c.info.summary.string() + " and " + cs.front().info.summary.string() +
          " predict different classes: " + file.string() + " has " + std::to_string(p.voxels.size(0)) +
          " class maps, " + out.front().source.string() + " has " +
          std::to_string(out.front().voxels.size(0)));
    out.push_back(std::move(p));
  }
  return out;
}

/// The members' probabilities averaged on the first member's grid, as its argmax label map.
pipeline::Image ensemble_labels(const std::vector<pipeline::Image>& probs,
                                const std::vector<std::size_t>& members) {
  const pipeline::Image& ref = probs[members.front()];
  at::Tensor sum = ref.voxels.clone();
  for (std::size_t i = 1; i < members.size(); ++i) {
    const pipeline::Image& p = probs[members[i]];
    if (p.size() == ref.size() && geometry_close(p.geometry, ref.geometry, 1e-3)) {
      sum += p.voxels;
      continue;
    }
    at::Tensor q = pipeline::resample_to_grid(p.voxels, p.geometry, ref.geometry, ref.size());
    q[0] += (1.0 - q.sum(0)).clamp_min(0.0);  // outside the member's grid: background
    sum += q;
  }
  pipeline::Image labels;
  labels.geometry = ref.geometry;
  labels.modality = "SEG";
  labels.voxels = sum.argmax(0, true).to(sum.size(0) <= 256 ? at::kByte : at::kShort).contiguous();
  return labels;
}

/// A scratch folder removed when it goes out of scope.
struct ScratchDir {
  fs::path path;
  ScratchDir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("segflow-select-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

/// Writes every ensemble's label map of every case into scratch/<ensemble>/<case>.nii.
Status write_ensemble_maps(const std::vector<Config>& cs, const std::vector<std::vector<std::size_t>>& sets,
                           const fs::path& scratch) {
  for (std::size_t e = 0; e < sets.size(); ++e) {
    std::error_code ec;
    fs::create_directories(scratch / std::to_string(e), ec);
    if (ec)
      return io_error((scratch / std::to_string(e)).string() + ": cannot create the folder: " + ec.message());
  }
  for (std::size_t i = 0; i < cs.front().cases.size(); ++i) {
    SEGFLOW_ASSIGN_OR_RETURN(std::vector<pipeline::Image> probs, read_probabilities(cs, i));
    for (std::size_t e = 0; e < sets.size(); ++e)
      SEGFLOW_RETURN_IF_ERROR(pipeline::write_nifti(
          scratch / std::to_string(e) / (cs.front().cases[i].id + ".nii"), ensemble_labels(probs, sets[e])));
  }
  return Status::ok();
}

/// segflow eval's scores of one ensemble's label maps, counted per case as cv counts them.
Result<std::vector<CvCase>> score_maps(const fs::path& folder, const std::vector<CvCase>& cases,
                                       const std::map<std::string, fs::path>& gt) {
  EvaluateOptions eo;
  for (const auto& k : cases) eo.pairs.push_back({k.id, folder / (k.id + ".nii"), gt.at(k.id)});
  SEGFLOW_ASSIGN_OR_RETURN(EvaluationReport report, evaluate(eo));
  if (!report.failed.empty())
    return internal_error("select: case " + report.failed.front().first +
                          " of an ensemble could not be scored: " + report.failed.front().second);
  const nlohmann::json j = evaluation_json(report);
  std::map<std::string, CvCase> by_id;
  for (const auto& c : j["cases"]) {
    CvCase k = cv_case_of(c);
    by_id[k.id] = std::move(k);
  }
  std::vector<CvCase> out;
  for (const auto& k : cases) {
    auto it = by_id.find(k.id);
    if (it == by_id.end()) return internal_error("select: case " + k.id + " of an ensemble was not scored");
    out.push_back(it->second);
  }
  return out;
}

SelectCandidate candidate(const std::vector<Config>& cs, std::vector<std::size_t> members,
                          const std::vector<CvCase>& cases, const SelectOptions& o, const MetricInfo& m) {
  SelectCandidate c;
  for (auto i : members) c.name += (c.name.empty() ? "" : "+") + cs[i].info.name;
  c.members = std::move(members);
  c.values = cv_values(cases, m.member, o.label);
  c.score = bootstrap_interval(c.values, o.bootstrap, o.confidence, o.seed);
  return c;
}

/// Best first: finite means before none, then by mean, then fewer members, then given order.
void rank(std::vector<SelectCandidate>& rows, bool higher_is_better) {
  std::stable_sort(rows.begin(), rows.end(), [&](const SelectCandidate& a, const SelectCandidate& b) {
    const bool fa = std::isfinite(a.score.mean), fb = std::isfinite(b.score.mean);
    if (fa != fb) return fa;
    if (fa && a.score.mean != b.score.mean)
      return higher_is_better ? a.score.mean > b.score.mean : a.score.mean < b.score.mean;
    return a.members.size() < b.members.size();
  });
}

std::string fmt(double v, bool distance) {
  if (!std::isfinite(v)) return "-";
  char b[32];
  std::snprintf(b, sizeof b, distance ? "%.2f" : "%.4f", v);
  return b;
}

std::string interval_text(const CvInterval& i, bool distance) {
  return fmt(i.mean, distance) + " [" + fmt(i.low, distance) + ", " + fmt(i.high, distance) + "]";
}

/// The winner against the runner-up, in words.
void verdict(SelectionReport& r) {
  const bool distance = r.metric == "hd95";
  const std::string pct = std::to_string(static_cast<int>(std::lround(r.confidence * 100))) + "%";
  if (!std::isfinite(r.ranking.front().score.mean)) {
    r.distinguishable = false;
    r.statement = "no candidate has a value of the metric on these cases";
    return;
  }
  if (r.ranking.size() < 2 || !std::isfinite(r.ranking[1].score.mean)) {
    r.distinguishable = true;
    r.statement = "only one candidate has a value: " + r.ranking.front().name;
    return;
  }
  const SelectCandidate &w = r.ranking[0], &u = r.ranking[1];
  const auto inside = [](double x, const CvInterval& i) { return x >= i.low && x <= i.high; };
  r.distinguishable = !inside(w.score.mean, u.score) && !inside(u.score.mean, w.score);
  const std::string figures = w.name + " " + interval_text(w.score, distance) + ", runner-up " + u.name +
                              " " + interval_text(u.score, distance);
  r.statement = r.distinguishable ? "the winner is better than the runner-up at " + pct +
                                        ": neither mean lies in the other's interval (" + figures + ")"
                                  : "not distinguishable at " + pct + ": " +
                                        (inside(w.score.mean, u.score)
                                             ? "the winner's mean lies inside the runner-up's interval"
                                             : "the runner-up's mean lies inside the winner's interval") +
                                        " (" + figures + ")";
}

}  // namespace sel
}  // namespace

Result<SelectionReport> select_configuration(const SelectOptions& o) {
  SEGFLOW_RETURN_IF_ERROR(sel::check_options(o));
  SEGFLOW_ASSIGN_OR_RETURN(const sel::MetricInfo m, sel::metric_of(o.metric));
  std::vector<sel::Config> cs;
  for (const auto& s : o.summaries) {
    SEGFLOW_ASSIGN_OR_RETURN(sel::Config c, sel::read_config(s));
    cs.push_back(std::move(c));
  }
  SEGFLOW_RETURN_IF_ERROR(sel::check_comparable(cs));
  sel::name_configs(cs);
  const std::size_t k = o.max_ensemble == 0 ? cs.size() : static_cast<std::size_t>(o.max_ensemble);
  const auto sets = sel::ensembles(cs.size(), k);
  SelectionReport r;
  r.metric = m.name;
  r.label = o.label;
  r.higher_is_better = m.higher_is_better;
  r.confidence = o.confidence;
  r.bootstrap = o.bootstrap;
  r.seed = o.seed;
  r.dataset = cs.front().identity.dataset;
  for (const auto& c : cs.front().cases) r.cases.push_back(c.id);
  for (std::size_t i = 0; i < cs.size(); ++i) {
    r.configurations.push_back(cs[i].info);
    r.ranking.push_back(sel::candidate(cs, {i}, cs[i].cases, o, m));
  }
  if (!sets.empty()) {
    SEGFLOW_RETURN_IF_ERROR(sel::check_probabilities(cs));
    SEGFLOW_ASSIGN_OR_RETURN(const auto gt, sel::ground_truths(cs.front()));
    sel::ScratchDir scratch;
    SEGFLOW_RETURN_IF_ERROR(sel::write_ensemble_maps(cs, sets, scratch.path));
    for (std::size_t e = 0; e < sets.size(); ++e) {
      SEGFLOW_ASSIGN_OR_RETURN(const auto scored,
                               sel::score_maps(scratch.path / std::to_string(e), cs.front().cases, gt));
      r.ranking.push_back(sel::candidate(cs, sets[e], scored, o, m));
    }
  }
  if (o.label != 0 && std::none_of(r.ranking.begin(), r.ranking.end(),
                                   [](const SelectCandidate& c) { return c.score.cases > 0; }))
    return invalid_argument("--class: no out-of-fold case has class " + std::to_string(o.label) +
                            " in its prediction or ground truth");
  sel::rank(r.ranking, r.higher_is_better);
  sel::verdict(r);
  return r;
}

namespace {
namespace sel {

nlohmann::json num(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

nlohmann::json score_json(const CvInterval& i) {
  return {{"mean", num(i.mean)}, {"low", num(i.low)}, {"high", num(i.high)}, {"cases", i.cases}};
}

nlohmann::json configuration_json(const SelectConfiguration& c) {
  std::vector<std::string> runs;
  for (const auto& p : c.runs) runs.push_back(p.string());
  return {{"name", c.name},
          {"summary", absolute_path(c.summary).string()},
          {"runs", runs},
          {"probabilities", c.probabilities}};
}

nlohmann::json row_json(const SelectionReport& r, std::size_t i) {
  const SelectCandidate& c = r.ranking[i];
  nlohmann::json members = nlohmann::json::array(), values = nlohmann::json::object();
  for (auto m : c.members) members.push_back(r.configurations[m].name);
  for (std::size_t k = 0; k < r.cases.size(); ++k) values[r.cases[k]] = num(c.values[k]);
  nlohmann::json j = score_json(c.score);
  j["rank"] = i + 1;
  j["name"] = c.name;
  j["members"] = members;
  j["ensemble"] = c.members.size() > 1;
  j["values"] = values;
  return j;
}

nlohmann::json winner_json(const SelectionReport& r) {
  const SelectCandidate& w = r.ranking.front();
  nlohmann::json members = nlohmann::json::array();
  std::vector<std::string> runs, checkpoints;
  for (auto m : w.members) {
    members.push_back(configuration_json(r.configurations[m]));
    for (const auto& run : r.configurations[m].runs) {
      runs.push_back(run.string());
      checkpoints.push_back(RunLayout(run).last_checkpoint().string());
    }
  }
  nlohmann::json j = score_json(w.score);
  j["name"] = w.name;
  j["members"] = members;
  j["runs"] = runs;
  j["checkpoints"] = checkpoints;
  return j;
}

}  // namespace sel
}  // namespace

nlohmann::json selection_json(const SelectionReport& r) {
  nlohmann::json configurations = nlohmann::json::array(), ranking = nlohmann::json::array();
  for (const auto& c : r.configurations) configurations.push_back(sel::configuration_json(c));
  for (std::size_t i = 0; i < r.ranking.size(); ++i) ranking.push_back(sel::row_json(r, i));
  nlohmann::json runner_up = nullptr;
  if (r.ranking.size() > 1) runner_up = ranking[1];
  return {{"metric", r.metric},
          {"class", r.label == 0 ? nlohmann::json("mean") : nlohmann::json(r.label)},
          {"higher_is_better", r.higher_is_better},
          {"confidence", r.confidence},
          {"bootstrap", r.bootstrap},
          {"seed", r.seed},
          {"dataset", r.dataset},
          {"cases", r.cases},
          {"configurations", configurations},
          {"ranking", ranking},
          {"winner", sel::winner_json(r)},
          {"runner_up", runner_up},
          {"distinguishable", r.distinguishable},
          {"statement", r.statement}};
}

std::string selection_text(const SelectionReport& r) {
  const bool distance = r.metric == "hd95";
  std::string title = sel::metric_of(r.metric)->title;
  const std::string what =
      (r.label == 0 ? "mean " + title + " over classes" : title + " of class " + std::to_string(r.label));
  std::ostringstream out;
  out << r.cases.size() << " out-of-fold cases of " << r.dataset << "; " << r.configurations.size()
      << " configuration(s), " << r.ranking.size() - r.configurations.size() << " ensemble(s); " << what
      << " (" << (r.higher_is_better ? "higher" : "lower") << " is better), "
      << static_cast<int>(std::lround(r.confidence * 100)) << "% bootstrap intervals (" << r.bootstrap
      << " resamples of the cases, the same for every row)\n";
  char line[1024];
  std::snprintf(line, sizeof line, "%-4s  %-40s %7s  %-28s %5s\n", "rank", "configuration", "members",
                (title + " [interval]").c_str(), "cases");
  out << line;
  for (std::size_t i = 0; i < r.ranking.size(); ++i) {
    const SelectCandidate& c = r.ranking[i];
    std::snprintf(line, sizeof line, "%-4zu  %-40s %7zu  %-28s %5lld\n", i + 1, c.name.c_str(),
                  c.members.size(), sel::interval_text(c.score, distance).c_str(),
                  static_cast<long long>(c.score.cases));
    out << line;
  }
  out << "winner: " << r.ranking.front().name << "\n" << r.statement << "\n";
  return out.str();
}

}  // namespace segflow::models
