// segflow cv: the folds of one configuration pooled into a cross-validation summary
// (models/evidence/cross_validation.hpp).
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "apps/cli_args.hpp"
#include "apps/commands.hpp"
#include "messages/file_util.hpp"
#include "models/evidence/cross_validation.hpp"

namespace segflow::apps {

namespace {

constexpr Option kBootstrapOptions[] = {
    {"bootstrap", "N", "resamples of the cases, >= 100; default 1000"},
    {"confidence", "C", "of the intervals, in (0, 1); default 0.95"},
    {"seed", "S", "of the resampling, >= 0; default 0"},
};
constexpr Option kCvOptions[] = {
    {"out", "DIR", "write cv_summary.json and cv_cases.csv there"},
    {"json", "", "print the summary as one JSON object instead of the table"},
};

}  // namespace

std::span<const Option> bootstrap_options() { return kBootstrapOptions; }

Status bootstrap_from_args(const Args& a, std::int64_t& bootstrap, double& confidence, std::uint64_t& seed) {
  if (a.has("bootstrap")) {
    SEGFLOW_ASSIGN_OR_RETURN(long long n, parse_int("--bootstrap", a.get("bootstrap")));
    bootstrap = n;
  }
  if (a.has("seed")) {
    SEGFLOW_ASSIGN_OR_RETURN(long long n, parse_int("--seed", a.get("seed")));
    if (n < 0) return invalid_argument("--seed: expected an integer >= 0, got " + a.get("seed"));
    seed = static_cast<std::uint64_t>(n);
  }
  if (a.has("confidence")) {
    const std::string t = a.get("confidence");
    char* end = nullptr;
    confidence = std::strtod(t.c_str(), &end);
    if (t.empty() || *end != '\0')
      return invalid_argument("--confidence: expected a number in (0, 1), got '" + t + "'");
  }
  return Status::ok();
}

const Command& cv_command() {
  static const Command c{
      "cv",
      cmd_cv,
      {{"",
        "cv RUN... [--out DIR] [--json] [--bootstrap N] [--confidence C] [--seed S]",
        "the folds' out-of-fold scores pooled, with bootstrap intervals",
        "Per class Dice, HD95 and NSD with bootstrap intervals over the cases, and a row per case "
        "(docs/how-to/cross-validation.md).",
        {{"RUN...",
          "the run folders of one configuration, one per fold (each with its validation/ predictions)"}},
        {{"", kCvOptions}, {"bootstrap intervals", kBootstrapOptions}}}}};
  return c;
}

int cmd_cv(int argc, char** argv) {
  auto a = parse_args(argc, argv, 2, cv_command().forms.front());
  if (!a.is_ok()) return fail("cv", a.status());
  models::CvOptions o;
  for (const auto& p : a->positional) o.runs.emplace_back(p);
  if (o.runs.empty())
    return fail("cv", invalid_argument("expected run folders (usage: segflow cv RUN... [--out DIR] [--json] "
                                       "[--bootstrap N] [--confidence 0.95] [--seed S])"));
  if (Status st = bootstrap_from_args(*a, o.bootstrap, o.confidence, o.seed); !st.is_ok())
    return fail("cv", st);
  auto r = models::cross_validate(o);
  if (!r.is_ok()) return fail("cv", r.status());
  if (a->has("out")) {
    const std::filesystem::path out = a->get("out");
    std::error_code ec;
    std::filesystem::create_directories(out, ec);
    if (ec) return fail("cv", io_error(out.string() + ": --out: cannot create the folder: " + ec.message()));
    for (const auto& [name, text] :
         {std::pair<const char*, std::string>{"cv_summary.json", models::cv_json(*r).dump(2) + "\n"},
          {"cv_cases.csv", models::cv_csv(*r)}}) {
      if (Status st = write_file_atomically(out / name, text); !st.is_ok()) return fail("cv", st);
    }
  }
  if (a->flag("json"))
    std::cout << models::cv_json(*r).dump() << '\n';
  else
    std::cout << models::cv_text(*r);
  return 0;
}

}  // namespace segflow::apps
