// segflow select: the configuration (or ensemble of configurations) chosen on the
// out-of-fold evidence of their cv summaries (models/selection.hpp).
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <iostream>

#include "apps/cli_args.hpp"
#include "apps/commands.hpp"
#include "messages/file_util.hpp"
#include "models/selection.hpp"

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
  if (a.has("bootstrap")) {
    SEGFLOW_ASSIGN_OR_RETURN(long long n, parse_int("--bootstrap", a.get("bootstrap")));
    o.bootstrap = n;
  }
  if (a.has("seed")) {
    SEGFLOW_ASSIGN_OR_RETURN(long long n, parse_int("--seed", a.get("seed")));
    if (n < 0) return invalid_argument("--seed: expected an integer >= 0, got " + a.get("seed"));
    o.seed = static_cast<std::uint64_t>(n);
  }
  if (a.has("confidence")) {
    const std::string t = a.get("confidence");
    char* end = nullptr;
    o.confidence = std::strtod(t.c_str(), &end);
    if (t.empty() || *end != '\0')
      return invalid_argument("--confidence: expected a number in (0, 1), got '" + t + "'");
  }
  return Status::ok();
}

}  // namespace

int cmd_select(int argc, char** argv) {
  auto a = parse_args(
      argc, argv, 2, {"metric", "class", "max-ensemble", "out", "bootstrap", "confidence", "seed"}, {"json"});
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
