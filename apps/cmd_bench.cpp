// segflow bench CONFIG: end-to-end and compute-only throughput of a job, as JSON lines.
#include <nlohmann/json.hpp>

#include <iostream>
#include <sstream>

#include "actors/jobs/bench.hpp"
#include "apps/cli_args.hpp"
#include "apps/commands.hpp"
#include "models/job_config.hpp"
#include "pipeline/stage_registry.hpp"

namespace segflow::apps {

int cmd_bench(int argc, char** argv) {
  auto a = parse_args(argc, argv, 2, {"set", "seconds", "epochs", "loaders"}, {"json"});
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
