#include "models/cross_validation.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "models/metrics.hpp"

namespace segflow::models {

namespace fs = std::filesystem;

namespace {

Result<nlohmann::json> read_json(const fs::path& file, const std::string& what) {
  std::ifstream in(file);
  if (!in) return not_found(file.string() + ": " + what);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return corrupt_data(file.string() + ": not a JSON object");
  return j;
}

double value_of(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : kNaN;
}

/// What must agree between runs: the dataset and its classes.
struct RunIdentity {
  std::string root;
  nlohmann::json num_classes, labels;
};

Result<RunIdentity> identity_of(const fs::path& run) {
  SEGFLOW_ASSIGN_OR_RETURN(nlohmann::json cfg,
                           read_json(run / "config.json", "no config.json (expected a segflow run folder)"));
  const nlohmann::json data = cfg.value("data", nlohmann::json::object());
  RunIdentity id;
  std::error_code ec;
  const std::string root = data.value("root", "");
  const fs::path canonical = fs::weakly_canonical(root, ec);
  id.root = ec ? root : canonical.string();
  id.num_classes = data.value("num_classes", nlohmann::json());
  id.labels = data.value("labels", nlohmann::json());
  return id;
}

/// The scored cases of one run's validation/summary.json.
Status read_cases(const fs::path& run, std::int64_t& fold, std::map<std::int64_t, std::string>& names,
                  std::vector<CvCase>& out) {
  SEGFLOW_ASSIGN_OR_RETURN(
      nlohmann::json s,
      read_json(run / "validation" / "summary.json",
                "no out-of-fold predictions (train with validation.save_predictions: true; an unfinished "
                "run has none)"));
  fold = s.value("fold", std::int64_t{-1});
  if (!s.contains("cases") || !s["cases"].is_array() || s["cases"].empty())
    return corrupt_data((run / "validation" / "summary.json").string() + ": cases: expected scored cases");
  for (const auto& c : s["cases"]) {
    CvCase k;
    k.id = c.value("case", "");
    k.run = run;
    k.fold = fold;
    const nlohmann::json classes = c.value("classes", nlohmann::json::object());
    for (const auto& [label, sc] : classes.items()) {
      const std::int64_t l = std::stoll(label);
      if (value_of(sc, "volume_pred_ml") == 0.0 && value_of(sc, "volume_gt_ml") == 0.0) continue;
      k.dice[l] = value_of(sc, "dice");
      k.hd95[l] = value_of(sc, "hd95");
      k.nsd[l] = value_of(sc, "nsd");
      if (sc.contains("name") && sc["name"].is_string()) names[l] = sc["name"].get<std::string>();
    }
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

/// The mean of `values` (NaN = no value for that case) and its percentile bootstrap interval.
CvInterval interval(const std::vector<double>& values, const CvOptions& o) {
  CvInterval r;
  std::vector<std::size_t> all(values.size());
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
  r.mean = mean_of(values, all, r.cases);
  if (r.cases == 0) {
    r.low = r.high = kNaN;
    return r;
  }
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<std::size_t> pick(0, values.size() - 1);
  std::vector<double> means;
  std::vector<std::size_t> sample(values.size());
  for (std::int64_t b = 0; b < o.bootstrap; ++b) {
    for (auto& s : sample) s = pick(rng);
    std::int64_t n = 0;
    const double m = mean_of(values, sample, n);
    if (n > 0) means.push_back(m);
  }
  std::sort(means.begin(), means.end());
  const double tail = (1.0 - o.confidence) / 2.0;
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

/// One metric of one class over the cases (NaN where the case lacks the class).
std::vector<double> column(const std::vector<CvCase>& cases, std::map<std::int64_t, double> CvCase::*metric,
                           std::int64_t label) {
  std::vector<double> v;
  for (const auto& c : cases) {
    const auto& m = c.*metric;
    auto it = m.find(label);
    v.push_back(it == m.end() ? kNaN : it->second);
  }
  return v;
}

/// Per case the mean over its classes of one metric (finite values).
std::vector<double> class_means(const std::vector<CvCase>& cases,
                                std::map<std::int64_t, double> CvCase::*metric) {
  std::vector<double> v;
  for (const auto& c : cases) {
    double sum = 0;
    int n = 0;
    for (const auto& [l, x] : c.*metric)
      if (std::isfinite(x)) sum += x, ++n;
    v.push_back(n ? sum / n : kNaN);
  }
  return v;
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
  std::optional<RunIdentity> first;
  std::map<std::string, fs::path> seen;
  for (const auto& run : o.runs) {
    SEGFLOW_ASSIGN_OR_RETURN(RunIdentity id, identity_of(run));
    if (!first) {
      first = id;
    } else if (id.root != first->root) {
      return invalid_argument("cv: runs of different datasets: " + o.runs.front().string() + " trained on " +
                              first->root + ", " + run.string() + " on " + id.root);
    } else if (id.num_classes != first->num_classes || id.labels != first->labels) {
      return invalid_argument("cv: runs with different classes: " + o.runs.front().string() + " has " +
                              first->num_classes.dump() + " " + first->labels.dump() + ", " + run.string() +
                              " has " + id.num_classes.dump() + " " + id.labels.dump());
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
  r.dataset = first->root;
  return Status::ok();
}

}  // namespace

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
    k.dice = interval(column(r.cases, &CvCase::dice, l), o);
    k.hd95 = interval(column(r.cases, &CvCase::hd95, l), o);
    k.nsd = interval(column(r.cases, &CvCase::nsd, l), o);
    for (const auto& c : r.cases)
      if (c.dice.count(l) && !std::isfinite(c.hd95.at(l))) ++k.missed;
    r.classes.push_back(k);
  }
  r.mean.name = "mean";
  r.mean.dice = interval(class_means(r.cases, &CvCase::dice), o);
  r.mean.hd95 = interval(class_means(r.cases, &CvCase::hd95), o);
  r.mean.nsd = interval(class_means(r.cases, &CvCase::nsd), o);
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

}  // namespace segflow::models
