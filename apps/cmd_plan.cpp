// segflow plan: dataset fingerprint -> nnU-Net-style plans and runnable job YAMLs
// (models/planning/plan.hpp); and the plan step of `segflow train DATASET`.
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <iostream>

#include "apps/cli_args.hpp"
#include "apps/commands.hpp"
#include "messages/file_util.hpp"
#include "models/planning/plan.hpp"

namespace segflow::apps {

namespace fs = std::filesystem;
namespace planning = models::planning;

namespace {

Result<double> parse_positive(const std::string& option, const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(v) || v <= 0)
    return invalid_argument("--" + option + ": expected a number > 0, got '" + text + "'");
  return v;
}

Result<std::vector<planning::ConfigurationKind>> parse_configurations(const std::string& list) {
  std::vector<planning::ConfigurationKind> out;
  for (std::size_t p = 0; p <= list.size();) {
    const std::size_t q = std::min(list.find(',', p), list.size());
    if (q > p) {
      auto k = planning::parse_configuration(list.substr(p, q - p));
      if (!k.is_ok()) return k.status().with_context("--configurations");
      out.push_back(*k);
    }
    p = q + 1;
  }
  if (out.empty())
    return invalid_argument("--configurations: expected 2d, 3d_fullres and/or 3d_lowres, got '" + list + "'");
  return out;
}

/// One line per planned configuration.
void print_summary(const planning::PlanResult& r, const fs::path& out) {
  const auto& fp = r.fingerprint;
  std::fprintf(stderr, "fingerprint: %zu cases, %zu excluded\n", fp.cases.size(), fp.excluded.size());
  for (const auto& e : fp.excluded)
    std::fprintf(stderr, "  excluded %s: %s\n", e.id.c_str(), e.message.c_str());
  for (const auto& n : r.notes) std::fprintf(stderr, "note: %s\n", n.c_str());
  for (const auto& c : r.configurations) {
    std::string patch, sp;
    for (std::size_t i = 0; i < c.topology.patch_size.size(); ++i) {
      patch += (i ? "x" : "") + std::to_string(c.topology.patch_size[i]);
      char b[32];
      std::snprintf(b, sizeof b, "%s%.4g", i ? "x" : "", c.spacing[i]);
      sp += b;
    }
    std::printf("%-10s patch %s (nnU-Net axis order) spacing %s mm, batch %lld, %lld stages of %s -> %s\n",
                to_string(c.kind), patch.c_str(), sp.c_str(), static_cast<long long>(c.batch_size),
                static_cast<long long>(c.topology.n_stages()),
                r.constants.residual_encoder ? "res_enc_unet" : "plain_unet",
                (out / planning::yaml_file_name(c.kind)).c_str());
  }
  std::printf("plan folder: %s\n", out.c_str());
}

constexpr Option kPlannerOptions[] = {
    {"preset", "default|resenc-m|resenc-l|resenc-xl",
     "which of nnU-Net's planners: default (PlainConvUNet) or a residual encoder preset "
     "(ResidualEncoderUNet, "
     "memory targets 8, 24, 40 GB); default: default"},
    {"device", "cpu|cuda|cuda:N",
     "where trial steps run and the recipes train; default cuda:0 when visible, else cpu"},
    {"memory-gb", "G", "the memory target, > 0; default the preset's (8, resenc-l 24, resenc-xl 40)"},
    {"memory-model", "measured|nnunet", "measured (default: trial steps) or nnunet (nnU-Net's estimate)"},
    {"max-step-s", "S", "step-time budget of the measured model, > 0; default 2 on a CPU, none on CUDA"},
    {"amp", "auto|none|bf16|fp16", "mixed precision of the trials and recipes; default auto"},
    {"threads", "N", "fingerprint reader threads, >= 0; default 0: one per core"},
};
constexpr Option kPlanOptions[] = {
    {"out", "DIR",
     "the plan folder (fingerprint.json, plans.json, <configuration>.yaml); default DATASET/.segflow-plans"},
    {"configurations", "2d,3d_fullres,3d_lowres",
     "which to plan (3d_lowres only when nnU-Net's rule keeps it); default all three"},
    {"json", "", "print plans.json instead of the summary"},
};

}  // namespace

std::span<const Option> planner_options() { return kPlannerOptions; }

const Command& plan_command() {
  static const Command c{
      "plan",
      cmd_plan,
      {{"",
        "plan DATASET [--out DIR] [--configurations 2d,3d_fullres,3d_lowres] [--preset P] [--device "
        "cpu|cuda:N] "
        "[--memory-gb G] [--memory-model measured|nnunet] [--max-step-s S] [--amp A] [--threads N] [--json]",
        "fingerprint a dataset and write nnU-Net-style plans and one runnable job YAML per configuration",
        "docs/how-to/plan.md",
        {{"DATASET", "a dataset folder (MSD / nnU-Net v2, DICOM cases or MedSAM npy)"}},
        {{"", kPlanOptions}, {"planner", kPlannerOptions}}}}};
  return c;
}

Result<planning::PlanOptions> plan_options_from_args(const Args& a) {
  planning::PlanOptions o;
  o.device = a.get("device", planning::default_plan_device());
  if (o.device != "cpu" && o.device != "cuda" && o.device.rfind("cuda:", 0) != 0)
    return invalid_argument("--device: expected cpu, cuda or cuda:N, got '" + o.device + "'");
  if (a.has("configurations")) {
    SEGFLOW_ASSIGN_OR_RETURN(o.configurations, parse_configurations(a.get("configurations")));
  }
  if (a.has("preset")) SEGFLOW_RETURN_IF_ERROR(planning::set_preset(o, a.get("preset"), false));
  if (a.has("memory-gb")) {
    SEGFLOW_ASSIGN_OR_RETURN(o.memory_gb, parse_positive("memory-gb", a.get("memory-gb")));
  }
  if (a.has("max-step-s")) {
    SEGFLOW_ASSIGN_OR_RETURN(o.max_step_s, parse_positive("max-step-s", a.get("max-step-s")));
  }
  if (a.has("memory-model")) {
    SEGFLOW_ASSIGN_OR_RETURN(o.memory_model, planning::parse_memory_model(a.get("memory-model")));
  }
  if (a.has("amp")) o.amp = a.get("amp");
  if (a.has("threads")) {
    SEGFLOW_ASSIGN_OR_RETURN(const long long t, parse_int("--threads", a.get("threads")));
    if (t < 0) return invalid_argument("--threads: expected an integer >= 0, got " + a.get("threads"));
    o.fingerprint.threads = static_cast<int>(t);
  }
  return o;
}

Result<fs::path> ensure_plan(const fs::path& dataset, const fs::path& out, planning::ConfigurationKind kind,
                             planning::PlanOptions options) {
  SEGFLOW_ASSIGN_OR_RETURN(
      planning::EnsuredPlan e,
      planning::plan_or_reuse(dataset, out, kind, std::move(options), [](const std::string& line) {
        std::fprintf(stderr, "segflow train: %s\n", line.c_str());
      }));
  if (e.plan) print_summary(*e.plan, out);
  return e.yaml;
}

int cmd_plan(int argc, char** argv) {
  auto a = parse_args(argc, argv, 2, plan_command().forms.front());
  if (!a.is_ok()) return fail("plan", a.status());
  if (a->positional.size() != 1)
    return fail("plan",
                invalid_argument("expected one DATASET folder, got " + std::to_string(a->positional.size())));
  const fs::path dataset = a->positional[0];
  const fs::path out = a->has("out") ? fs::path(a->get("out")) : dataset / ".segflow-plans";
  auto o = plan_options_from_args(*a);
  if (!o.is_ok()) return fail("plan", o.status());
  auto r = planning::plan_into_folder(dataset, out, *o);
  if (!r.is_ok()) return fail("plan", r.status());
  if (a->flag("json"))
    std::cout << r->plans_json().dump() << '\n';
  else
    print_summary(*r, out);
  return 0;
}

}  // namespace segflow::apps
