#include "models/evidence/cross_validation.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "messages/file_util.hpp"
#include "models/training/metrics.hpp"
#include "models/training/run_layout.hpp"

namespace segflow::models {

namespace fs = std::filesystem;

namespace {

double value_of(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : kNaN;
}

/// The scored cases of one run's validation/summary.json.
Status read_cases(const fs::path& run, std::int64_t& fold, std::map<std::int64_t, std::string>& names,
                  std::vector<CvCase>& out) {
  SEGFLOW_ASSIGN_OR_RETURN(
      nlohmann::json s,
      read_json_object(
          RunLayout(run).validation_summary(),
          "no out-of-fold predictions (train with validation.save_predictions: true; an unfinished "
          "run has none)"));
  fold = s.value("fold", std::int64_t{-1});
  if (!s.contains("cases") || !s["cases"].is_array() || s["cases"].empty())
    return corrupt_data(RunLayout(run).validation_summary().string() + ": cases: expected scored cases");
  for (const auto& c : s["cases"]) {
    CvCase k = cv_case_of(c, &names);
    k.run = run;
    k.fold = fold;
    out.push_back(std::move(k));
  }
  return Status::ok();
}

/// Mean of the finite values among `picks` (indices into `values`).
double mean_of(const std::vector<double>& values, const std::vector<std::size_t>& picks, std::int64_t& n) {
  double sum = 0;
  n = 0;
  for (auto i : picks)
    if (std::isfinite(values[i])) sum += values[i], ++n;
  return n ? sum / static_cast<double>(n) : kNaN;
}

Status check_options(const CvOptions& o) {
  if (o.runs.empty()) return invalid_argument("cv: expected one or more run folders");
  if (o.bootstrap < 100)
    return invalid_argument("--bootstrap: expected >= 100 resamples, got " + std::to_string(o.bootstrap));
  if (!(o.confidence > 0 && o.confidence < 1))
    return invalid_argument("--confidence: expected a number in (0, 1), got " + std::to_string(o.confidence));
  return Status::ok();
}

/// Reads every run: identities agree, no case in two runs.
Status collect(const CvOptions& o, CvReport& r, std::map<std::int64_t, std::string>& names) {
  std::optional<CvRunIdentity> first;
  std::map<std::string, fs::path> seen;
  for (const auto& run : o.runs) {
    SEGFLOW_ASSIGN_OR_RETURN(CvRunIdentity id, cv_run_identity(run));
    if (!first) {
      first = id;
    } else if (id.dataset != first->dataset) {
      return invalid_argument("cv: runs of different datasets: " + o.runs.front().string() + " trained on " +
                              first->dataset + ", " + run.string() + " on " + id.dataset);
    } else if (id.classes != first->classes) {
      return invalid_argument("cv: runs with different classes: " + o.runs.front().string() + " has " +
                              first->classes + ", " + run.string() + " has " + id.classes);
    }
    std::int64_t fold = -1;
    std::vector<CvCase> cases;
    SEGFLOW_RETURN_IF_ERROR(read_cases(run, fold, names, cases));
    for (auto& c : cases) {
      if (auto [it, fresh] = seen.emplace(c.id, run); !fresh)
        return invalid_argument("cv: case " + c.id + " is in the validation of both " + it->second.string() +
                                " and " + run.string() + " (expected one run per fold)");
      r.cases.push_back(std::move(c));
    }
    r.runs.push_back(run);
    r.folds.push_back(fold);
  }
  r.dataset = first->dataset;
  return Status::ok();
}

}  // namespace

CvInterval bootstrap_interval(const std::vector<double>& values, std::int64_t resamples, double confidence,
                              std::uint64_t seed) {
  CvInterval r;
  std::vector<std::size_t> all(values.size());
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
  r.mean = mean_of(values, all, r.cases);
  if (r.cases == 0) {
    r.low = r.high = kNaN;
    return r;
  }
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::size_t> pick(0, values.size() - 1);
  std::vector<double> means;
  std::vector<std::size_t> sample(values.size());
  for (std::int64_t b = 0; b < resamples; ++b) {
    for (auto& s : sample) s = pick(rng);
    std::int64_t n = 0;
    const double m = mean_of(values, sample, n);
    if (n > 0) means.push_back(m);
  }
  std::sort(means.begin(), means.end());
  const double tail = (1.0 - confidence) / 2.0;
  const auto at = [&](double q) {
    const double pos = q * static_cast<double>(means.size() - 1);
    const auto lo = static_cast<std::size_t>(std::floor(pos));
    const auto hi = std::min(lo + 1, means.size() - 1);
    return means[lo] + (means[hi] - means[lo]) * (pos - static_cast<double>(lo));
  };
  r.low = at(tail);
  r.high = at(1.0 - tail);
  return r;
}

std::vector<double> cv_values(const std::vector<CvCase>& cases, CvMetric metric, std::int64_t label) {
  std::vector<double> v;
  for (const auto& c : cases) {
    const auto& m = c.*metric;
    if (label != 0) {
      auto it = m.find(label);
      v.push_back(it == m.end() ? kNaN : it->second);
      continue;
    }
    double sum = 0;
    int n = 0;
    for (const auto& [l, x] : m)
      if (std::isfinite(x)) sum += x, ++n;
    v.push_back(n ? sum / n : kNaN);
  }
  return v;
}

CvCase cv_case_of(const nlohmann::json& c, std::map<std::int64_t, std::string>* names) {
  CvCase k;
  k.id = c.value("case", "");
  const nlohmann::json classes = c.value("classes", nlohmann::json::object());
  for (const auto& [label, sc] : classes.items()) {
    const std::int64_t l = std::stoll(label);
    if (value_of(sc, "volume_pred_ml") == 0.0 && value_of(sc, "volume_gt_ml") == 0.0) continue;
    k.dice[l] = value_of(sc, "dice");
    k.hd95[l] = value_of(sc, "hd95");
    k.nsd[l] = value_of(sc, "nsd");
    if (names && sc.contains("name") && sc["name"].is_string()) (*names)[l] = sc["name"].get<std::string>();
  }
  return k;
}

Result<CvRunIdentity> cv_run_identity(const fs::path& run) {
  SEGFLOW_ASSIGN_OR_RETURN(
      nlohmann::json cfg,
      read_json_object(RunLayout(run).config(), "no config.json (expected a segflow run folder)"));
  const nlohmann::json data = cfg.value("data", nlohmann::json::object());
  CvRunIdentity id;
  std::error_code ec;
  const std::string root = data.value("root", "");
  const fs::path canonical = fs::weakly_canonical(root, ec);
  id.dataset = ec ? root : canonical.string();
  id.classes = data.value("num_classes", nlohmann::json()).dump() + " " +
               data.value("labels", nlohmann::json()).dump();
  return id;
}

Result<CvReport> cross_validate(const CvOptions& o) {
  SEGFLOW_RETURN_IF_ERROR(check_options(o));
  CvReport r;
  r.confidence = o.confidence;
  r.bootstrap = o.bootstrap;
  std::map<std::int64_t, std::string> names;
  SEGFLOW_RETURN_IF_ERROR(collect(o, r, names));
  std::sort(r.cases.begin(), r.cases.end(), [](const CvCase& a, const CvCase& b) { return a.id < b.id; });
  std::set<std::int64_t> labels;
  for (const auto& c : r.cases)
    for (const auto& [l, d] : c.dice) labels.insert(l);
  for (auto l : labels) {
    CvClass k;
    k.label = l;
    if (auto it = names.find(l); it != names.end()) k.name = it->second;
    k.dice = bootstrap_interval(cv_values(r.cases, &CvCase::dice, l), o.bootstrap, o.confidence, o.seed);
    k.hd95 = bootstrap_interval(cv_values(r.cases, &CvCase::hd95, l), o.bootstrap, o.confidence, o.seed);
    k.nsd = bootstrap_interval(cv_values(r.cases, &CvCase::nsd, l), o.bootstrap, o.confidence, o.seed);
    for (const auto& c : r.cases)
      if (c.dice.count(l) && !std::isfinite(c.hd95.at(l))) ++k.missed;
    r.classes.push_back(k);
  }
  r.mean.name = "mean";
  r.mean.dice = bootstrap_interval(cv_values(r.cases, &CvCase::dice, 0), o.bootstrap, o.confidence, o.seed);
  r.mean.hd95 = bootstrap_interval(cv_values(r.cases, &CvCase::hd95, 0), o.bootstrap, o.confidence, o.seed);
  r.mean.nsd = bootstrap_interval(cv_values(r.cases, &CvCase::nsd, 0), o.bootstrap, o.confidence, o.seed);
  return r;
}

namespace {

nlohmann::json num(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

nlohmann::json interval_json(const CvInterval& i) {
  return {{"mean", num(i.mean)}, {"low", num(i.low)}, {"high", num(i.high)}, {"cases", i.cases}};
}

nlohmann::json class_json(const CvClass& k) {
  nlohmann::json j = {{"dice", interval_json(k.dice)},
                      {"hd95", interval_json(k.hd95)},
                      {"nsd", interval_json(k.nsd)},
                      {"missed", k.missed}};
  if (!k.name.empty()) j["name"] = k.name;
  return j;
}

nlohmann::json per_class(const std::map<std::int64_t, double>& m) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [l, v] : m) j[std::to_string(l)] = num(v);
  return j;
}

std::string fmt(double v, const char* f = "%.4f") {
  if (!std::isfinite(v)) return "";
  char b[32];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

std::string text_row(const std::string& what, const CvClass& k) {
  const auto cell = [](const CvInterval& i, const char* f) {
    if (!std::isfinite(i.mean)) return std::string("-");
    return fmt(i.mean, f) + " [" + fmt(i.low, f) + ", " + fmt(i.high, f) + "]";
  };
  char line[512];
  std::snprintf(line, sizeof line, "%-18s %5lld  %-26s %-26s %-26s\n", what.c_str(),
                static_cast<long long>(k.dice.cases), cell(k.dice, "%.4f").c_str(),
                cell(k.hd95, "%.2f").c_str(), cell(k.nsd, "%.4f").c_str());
  return line;
}

}  // namespace

nlohmann::json cv_json(const CvReport& r) {
  nlohmann::json classes = nlohmann::json::object();
  for (const auto& k : r.classes) classes[std::to_string(k.label)] = class_json(k);
  nlohmann::json cases = nlohmann::json::array();
  for (const auto& c : r.cases)
    cases.push_back({{"case", c.id},
                     {"run", c.run.string()},
                     {"fold", c.fold},
                     {"dice", per_class(c.dice)},
                     {"hd95", per_class(c.hd95)},
                     {"nsd", per_class(c.nsd)}});
  std::vector<std::string> runs;
  for (const auto& p : r.runs) runs.push_back(p.string());
  return {{"dataset", r.dataset.string()},
          {"runs", runs},
          {"folds", r.folds},
          {"confidence", r.confidence},
          {"bootstrap", r.bootstrap},
          {"classes", classes},
          {"mean", class_json(r.mean)},
          {"cases", cases}};
}

std::string cv_csv(const CvReport& r) {
  std::ostringstream out;
  out << "case,fold,class,name,dice,hd95,nsd\n";
  std::map<std::int64_t, std::string> names;
  for (const auto& k : r.classes) names[k.label] = k.name;
  for (const auto& c : r.cases)
    for (const auto& [l, d] : c.dice)
      out << c.id << ',' << c.fold << ',' << l << ',' << names[l] << ',' << fmt(d, "%.6f") << ','
          << fmt(c.hd95.at(l), "%.6f") << ',' << fmt(c.nsd.at(l), "%.6f") << '\n';
  return out.str();
}

std::string cv_text(const CvReport& r) {
  std::ostringstream out;
  out << r.cases.size() << " out-of-fold cases from " << r.runs.size() << " run(s) of " << r.dataset.string()
      << "; " << static_cast<int>(std::lround(r.confidence * 100)) << "% bootstrap intervals (" << r.bootstrap
      << " resamples of the cases)\n";
  char head[256];
  std::snprintf(head, sizeof head, "%-18s %5s  %-26s %-26s %-26s\n", "class", "cases", "Dice", "HD95 mm",
                "NSD");
  out << head;
  for (const auto& k : r.classes)
    out << text_row(std::to_string(k.label) + (k.name.empty() ? "" : " " + k.name), k);
  out << text_row("mean over classes", r.mean);
  return out.str();
}

namespace {

/// {"1": 0.9, "2": null} -> {1: 0.9, 2: NaN}.
Status per_class_back(const nlohmann::json& j, const std::string& where,
                      std::map<std::int64_t, double>& out) {
  if (!j.is_object()) return corrupt_data(where + ": expected an object {label: value}");
  for (const auto& [label, v] : j.items()) {
    char* end = nullptr;
    const long long l = std::strtoll(label.c_str(), &end, 10);
    if (label.empty() || *end != '\0' || l < 1 || !(v.is_number() || v.is_null()))
      return corrupt_data(where + ": expected label values >= 1 with a number or null, got \"" + label +
                          "\": " + v.dump());
    out[l] = v.is_number() ? v.get<double>() : kNaN;
  }
  return Status::ok();
}

}  // namespace

Result<CvReport> read_cv_summary(const fs::path& file) {
  SEGFLOW_ASSIGN_OR_RETURN(nlohmann::json j,
                           read_json_object(file,
                                            "no such cv summary (segflow cv RUN... --out DIR "
                                            "writes DIR/cv_summary.json)"));
  const std::string where = file.string();
  if (!j.contains("runs") || !j["runs"].is_array() || j["runs"].empty() || !j.contains("cases") ||
      !j["cases"].is_array() || j["cases"].empty())
    return corrupt_data(where + ": expected a cv summary with \"runs\" and \"cases\" (segflow cv --out)");
  CvReport r;
  r.dataset = j.value("dataset", "");
  r.confidence = j.value("confidence", 0.95);
  r.bootstrap = j.value("bootstrap", std::int64_t{0});
  for (const auto& run : j["runs"]) {
    if (!run.is_string()) return corrupt_data(where + ": runs: expected run folder paths, got " + run.dump());
    r.runs.emplace_back(run.get<std::string>());
  }
  if (j.contains("folds") && j["folds"].is_array())
    for (const auto& f : j["folds"]) r.folds.push_back(f.is_number_integer() ? f.get<std::int64_t>() : -1);
  for (std::size_t i = 0; i < j["cases"].size(); ++i) {
    const nlohmann::json& c = j["cases"][i];
    const std::string at = where + ": cases[" + std::to_string(i) + "]";
    if (!c.is_object() || !c.contains("case") || !c["case"].is_string() || !c.contains("run") ||
        !c["run"].is_string())
      return corrupt_data(at + ": expected {case, run, fold, dice, hd95, nsd}");
    CvCase k;
    k.id = c["case"].get<std::string>();
    k.run = c["run"].get<std::string>();
    k.fold = c.value("fold", std::int64_t{-1});
    for (auto [key, metric] : {std::pair<const char*, CvMetric>{"dice", &CvCase::dice},
                               {"hd95", &CvCase::hd95},
                               {"nsd", &CvCase::nsd}})
      SEGFLOW_RETURN_IF_ERROR(per_class_back(c.value(key, nlohmann::json()), at + "." + key, k.*metric));
    r.cases.push_back(std::move(k));
  }
  return r;
}

}  // namespace segflow::models
