// segflow cv: the folds of one configuration pooled into a cross-validation summary
// (models/cross_validation.hpp).
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "apps/cli_args.hpp"
#include "apps/commands.hpp"
#include "messages/file_util.hpp"
#include "models/cross_validation.hpp"

namespace segflow::apps {

int cmd_cv(int argc, char** argv) {
  auto a = parse_args(argc, argv, 2, {"out", "bootstrap", "confidence", "seed"}, {"json"});
  if (!a.is_ok()) return fail("cv", a.status());
  models::CvOptions o;
  for (const auto& p : a->positional) o.runs.emplace_back(p);
  if (o.runs.empty())
    return fail("cv", invalid_argument("expected run folders (usage: segflow cv RUN... [--out DIR] [--json] "
                                       "[--bootstrap N] [--confidence 0.95] [--seed S])"));
  if (a->has("bootstrap")) {
    auto n = parse_int("--bootstrap", a->get("bootstrap"));
    if (!n.is_ok()) return fail("cv", n.status());
    o.bootstrap = *n;
  }
  if (a->has("seed")) {
    auto n = parse_int("--seed", a->get("seed"));
    if (!n.is_ok()) return fail("cv", n.status());
    if (*n < 0)
      return fail("cv", invalid_argument("--seed: expected an integer >= 0, got " + a->get("seed")));
    o.seed = static_cast<std::uint64_t>(*n);
  }
  if (a->has("confidence")) {
    const std::string t = a->get("confidence");
    char* end = nullptr;
    o.confidence = std::strtod(t.c_str(), &end);
    if (t.empty() || *end != '\0')
      return fail("cv", invalid_argument("--confidence: expected a number in (0, 1), got '" + t + "'"));
  }
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
