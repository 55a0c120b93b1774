// segflow eval: predicted label maps scored against ground truth (models/evidence/evaluation.hpp).
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "apps/cli_args.hpp"
#include "apps/commands.hpp"
#include "models/evidence/evaluation.hpp"

namespace segflow::apps {

namespace {

/// "1,2,5" -> {1, 2, 5}; errors name --classes.
Result<std::vector<std::int64_t>> parse_classes(const std::string& text) {
  std::vector<std::int64_t> out;
  for (std::size_t p = 0; p <= text.size();) {
    const std::size_t q = std::min(text.find(',', p), text.size());
    const std::string item = text.substr(p, q - p);
    SEGFLOW_ASSIGN_OR_RETURN(long long v, parse_int("--classes", item));
    out.push_back(v);
    p = q + 1;
  }
  return out;
}

constexpr Option kEvalOptions[] = {
    {"pred", "P", "a predicted label map, or a folder or dataset of them; required"},
    {"gt", "G", "the ground truth: a label map, or a folder or dataset (matched by case id); required"},
    {"tolerance-mm", "T", "the tolerance of the normalized surface Dice, >= 0 mm; default 2"},
    {"classes", "1,2,...", "the label values to score; default every value > 0 seen"},
    {"json", "", "one JSON object on stdout instead of the table"},
    {"csv", "FILE", "also write one row per case and class there"},
};

}  // namespace

const Command& eval_command() {
  static const Command c{
      "eval",
      cmd_eval,
      {{"",
        "eval --pred P --gt G [--tolerance-mm T] [--classes 1,2,...] [--json] [--csv FILE]",
        "Dice, IoU, HD95, ASSD, surface Dice and volumes per case and class",
        "Files, or folders and datasets matched by case id. Exit status 1 when a case could not be read.",
        {},
        {{"", kEvalOptions}}}}};
  return c;
}

int cmd_eval(int argc, char** argv) {
  auto a = parse_args(argc, argv, 2, eval_command().forms.front());
  if (!a.is_ok()) return fail("eval", a.status());
  if (!a->positional.empty())
    return fail("eval", invalid_argument("unexpected argument '" + a->positional.front() +
                                         "' (usage: segflow eval --pred P --gt G [--tolerance-mm T] "
                                         "[--classes 1,2] [--json] [--csv FILE])"));
  for (const char* k : {"pred", "gt"})
    if (!a->has(k)) return fail("eval", invalid_argument(std::string("--") + k + ": required"));
  models::EvaluateOptions o;
  o.pred = a->get("pred");
  o.gt = a->get("gt");
  if (a->has("tolerance-mm")) {
    const std::string t = a->get("tolerance-mm");
    char* end = nullptr;
    const double v = std::strtod(t.c_str(), &end);
    if (t.empty() || *end != '\0' || !std::isfinite(v) || v < 0)
      return fail("eval", invalid_argument("--tolerance-mm: expected a number >= 0 (mm), got '" + t + "'"));
    o.tolerance_mm = v;
  }
  if (a->has("classes")) {
    auto c = parse_classes(a->get("classes"));
    if (!c.is_ok()) return fail("eval", c.status());
    o.classes = *c;
  }
  o.note = [](const std::string& line) { std::fprintf(stderr, "segflow eval: %s\n", line.c_str()); };
  auto r = models::evaluate(o);
  if (!r.is_ok()) return fail("eval", r.status());
  if (a->has("csv")) {
    const std::string path = a->get("csv");
    std::ofstream f(path, std::ios::binary);
    f << models::evaluation_csv(*r);
    f.close();
    if (!f) return fail("eval", io_error(path + ": --csv: cannot write the file"));
  }
  if (a->flag("json"))
    std::cout << models::evaluation_json(*r).dump() << '\n';
  else
    std::cout << models::evaluation_text(*r);
  return r->failed.empty() ? 0 : 1;
}

}  // namespace segflow::apps
