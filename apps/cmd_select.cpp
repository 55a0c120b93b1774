// segflow select: the configuration (or ensemble of configurations) chosen on the
// out-of-fold evidence of their cv summaries (models/evidence/selection.hpp).
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <iostream>

#include "apps/cli_args.hpp"
#include "apps/commands.hpp"
#include "messages/file_util.hpp"
#include "models/evidence/selection.hpp"

namespace segflow::apps {

namespace {

constexpr const char* kSelectUsage =
    "usage: segflow select CV_SUMMARY.json... [--metric dice|hd95|nsd] [--class N|mean] "
    "[--max-ensemble K] [--out selection.json] [--json] [--bootstrap N] [--confidence 0.95] [--seed S]";

/// The numeric options into `o`.
Status select_numbers(const Args& a, models::SelectOptions& o) {
  if (a.has("class") && a.get("class") != "mean") {
    SEGFLOW_ASSIGN_OR_RETURN(long long n, parse_int("--class", a.get("class")));
    if (n < 1) return invalid_argument("--class: expected a label value >= 1 or mean, got " + a.get("class"));
    o.label = n;
  }
  if (a.has("max-ensemble")) {
    SEGFLOW_ASSIGN_OR_RETURN(long long n, parse_int("--max-ensemble", a.get("max-ensemble")));
    if (n < 1)
      return invalid_argument("--max-ensemble: expected an integer >= 1, got " + a.get("max-ensemble"));
    o.max_ensemble = n;
  }
  return bootstrap_from_args(a, o.bootstrap, o.confidence, o.seed);
}

constexpr Option kSelectOptions[] = {
    {"metric", "dice|hd95|nsd", "dice (default), hd95 (mm, lower is better) or nsd (2 mm tolerance)"},
    {"class", "N|mean",
     "the class scored (a label value >= 1), or mean (default): per case the mean over its classes"},
    {"max-ensemble", "K",
     "largest ensemble tried, >= 1; 1 = single configurations only (no probabilities needed); default all"},
    {"out", "FILE", "write selection.json there (nothing is written when the command fails)"},
    {"json", "", "print selection.json as one line instead of the table"},
};

}  // namespace

const Command& select_command() {
  static const Command c{
      "select",
      cmd_select,
      {{"",
        "select CV_SUMMARY.json... [--metric dice|hd95|nsd] [--class N|mean] [--max-ensemble K] "
        "[--out selection.json] [--json] [--bootstrap N] [--confidence C] [--seed S]",
        "choose a configuration, or an ensemble of them, on the folds' out-of-fold evidence",
        "Ranks the configurations and every ensemble of 2..K of them on the same out-of-fold cases; prints "
        "the winner and whether the runner-up is within its confidence interval.",
        {{"CV_SUMMARY.json...", "one `segflow cv --out` summary per configuration"}},
        {{"", kSelectOptions}, {"bootstrap intervals", bootstrap_options()}}}}};
  return c;
}

int cmd_select(int argc, char** argv) {
  auto a = parse_args(argc, argv, 2, select_command().forms.front());
  if (!a.is_ok()) return fail("select", a.status());
  models::SelectOptions o;
  for (const auto& p : a->positional) o.summaries.emplace_back(p);
  if (o.summaries.empty())
    return fail("select", invalid_argument(std::string("expected cv summaries (") + kSelectUsage + ")"));
  o.metric = a->get("metric", "dice");
  if (Status st = select_numbers(*a, o); !st.is_ok()) return fail("select", st);
  auto r = models::select_configuration(o);
  if (!r.is_ok()) return fail("select", r.status());
  const nlohmann::json j = models::selection_json(*r);
  if (a->has("out"))
    if (Status st = write_file_atomically(a->get("out"), j.dump(2) + "\n"); !st.is_ok())
      return fail("select", st);
  if (a->flag("json"))
    std::cout << j.dump() << '\n';
  else
    std::cout << models::selection_text(*r);
  return 0;
}

}  // namespace segflow::apps
