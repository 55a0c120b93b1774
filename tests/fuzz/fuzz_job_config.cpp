// Fuzz harness: a job config, YAML text -> typed JobConfig -> validation (every stage built
// through the registry, the model, loss and optimizer constructed), as `segflow train`, the
// daemon's start and `--set` do before any data is read. Lines after a "--set--" line are
// `--set key=value` overrides.
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_target.hpp"
#include "models/training/job_config.hpp"
#include "pipeline/stage_registry.hpp"

SEGFLOW_FUZZ_TARGET(job_config) {
  static const pipeline::StageRegistry registry = pipeline::builtin_registry();
  constexpr std::string_view kSetLine = "\n--set--\n";
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const std::size_t cut = in.find(kSetLine);
  const std::string yaml(in.substr(0, cut));
  std::vector<std::string> overrides;
  if (cut != std::string_view::npos) {
    std::string_view rest = in.substr(cut + kSetLine.size());
    while (!rest.empty() && overrides.size() < 16) {
      const std::size_t nl = rest.find('\n');
      overrides.emplace_back(rest.substr(0, nl));
      rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    }
  }
  auto cfg = models::parse_job_config(yaml, "fuzz.yaml", overrides);
  if (!cfg.is_ok()) {
    invariant(!cfg.status().message().empty(), "a refused config without a message");
    return 0;
  }
  Status st = models::validate_job_config(*cfg, registry);
  invariant(st.is_ok() || !st.message().empty(), "a refused config without a message");
  return 0;
}
