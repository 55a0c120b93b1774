// segflow bench CONFIG: end-to-end and compute-only throughput of a job, as JSON lines.
#include <nlohmann/json.hpp>

#include <iostream>
#include <sstream>

#include "actors/jobs/bench.hpp"
#include "apps/cli_args.hpp"
#include "apps/commands.hpp"
#include "models/training/job_config.hpp"
#include "pipeline/stage_registry.hpp"

namespace segflow::apps {

namespace {

constexpr Option kBenchOptions[] = {
    {"seconds", "S", "measured seconds per loader, after a warm-up epoch, >= 1; default 60"},
    {"epochs", "N", "cap on the measured epochs, >= 1; default as many as fit in --seconds"},
    {"loaders", "actors,simple",
     "the data paths to measure: actors, simple or both; default the config's train.loader"},
    {"set", "key=value", "override a config key (repeatable)"},
    {"profile", "FILE",
     "write a Chrome trace (LibTorch's profiler) of the first loader's measured end-to-end epochs to FILE"},
    {"json", "", "JSON lines instead of readable lines"},
};

}  // namespace

const Command& bench_command() {
  static const Command c{
      "bench",
      cmd_bench,
      {{"",
        "bench CONFIG [--json] [--seconds S] [--epochs N] [--loaders actors,simple] [--profile FILE] [--set "
        "key=value ...]",
        "samples/s of the real data path + trainer vs the compute step alone",
        "Per loader: an end-to-end line (data path and trainer) and a compute-only line (the same steps on "
        "staged batches), then a summary with the pipeline efficiency and peak memory.",
        {{"CONFIG", "a job config (docs/reference/job-config.md)"}},
        {{"", kBenchOptions}}}}};
  return c;
}

int cmd_bench(int argc, char** argv) {
  auto a = parse_args(argc, argv, 2, bench_command().forms.front());
  if (!a.is_ok()) return fail("bench", a.status());
  if (a->positional.size() != 1)
    return fail("bench",
                invalid_argument("expected one CONFIG file, got " + std::to_string(a->positional.size())));
  auto cfg = models::load_job_config(a->positional[0], a->all("set"));
  if (!cfg.is_ok()) return fail("bench", cfg.status());
  if (Status st = models::validate_job_config(*cfg, pipeline::builtin_registry()); !st.is_ok())
    return fail("bench", st);
  actors::BenchOptions o;
  if (a->has("seconds")) {
    auto s = parse_int("--seconds", a->get("seconds"));
    if (!s.is_ok()) return fail("bench", s.status());
    if (*s < 1)
      return fail("bench", invalid_argument("--seconds: expected an integer >= 1, got " + a->get("seconds")));
    o.seconds = static_cast<double>(*s);
  }
  if (a->has("epochs")) {
    auto e = parse_int("--epochs", a->get("epochs"));
    if (!e.is_ok()) return fail("bench", e.status());
    if (*e < 1)
      return fail("bench", invalid_argument("--epochs: expected an integer >= 1, got " + a->get("epochs")));
    o.max_epochs = *e;
  }
  if (a->has("loaders")) {
    std::stringstream ss(a->get("loaders"));
    for (std::string l; std::getline(ss, l, ',');)
      if (!l.empty()) o.loaders.push_back(l);
  }
  if (a->has("profile")) {
    if (a->get("profile").empty())
      return fail("bench", invalid_argument("--profile: expected a file path, got ''"));
    o.profile_path = a->get("profile");
  }
  const bool as_json = a->flag("json");
  auto r = actors::bench_training(*cfg, o, [&](const nlohmann::json& j) {
    if (as_json) {
      std::cout << j.dump() << std::endl;
      return;
    }
    if (j["bench"] == "summary") {
      std::cout << "summary: pipeline efficiency " << j["pipeline_efficiency"].dump() << ", peak host "
                << j["peak_host_mb"].get<double>() << " MiB, peak device " << j["peak_gpu_mb"].get<double>()
                << " MiB\n";
      if (j.contains("profile")) std::cout << "profile: " << j["profile"].get<std::string>() << "\n";
      return;
    }
    std::cout << j["bench"].get<std::string>() << " (" << j["loader"].get<std::string>() << ", "
              << j["device"].get<std::string>() << "): " << j["samples_per_s"].get<double>() << " samples/s, "
              << j["step_ms"].get<double>() << " ms/step, data wait " << j["data_wait_ms"].get<double>()
              << " ms/step over " << j["steps"] << " steps\n";
  });
  if (!r.is_ok()) return fail("bench", r.status());
  return 0;
}

}  // namespace segflow::apps
