// A stage plugin for the tests: registers "test_invert" (x -> pivot - x on the keys).
// Built as a MODULE library with -Wl,--no-undefined: it links LibTorch only, which proves
// that the plugin surface (Stage, MapStage, Rng, OptionParser, StageRegistry::add,
// add_stage) needs nothing from segflow's static libraries.
#include <ATen/ATen.h>

#include "pipeline/plugin.hpp"
#include "pipeline/stage_registry.hpp"

namespace {

using namespace segflow;
using namespace segflow::pipeline;

struct TestInvertOptions {
  std::vector<std::string> keys{"image"};  ///< tensors to invert
  double pivot = 1.0;                      ///< x -> pivot - x
  void bind(OptionParser& p) {
    p.strings("keys", keys, true, "tensors to invert");
    p.number("pivot", pivot, Range::any(), "intensity units", "x -> pivot - x");
  }
};

class TestInvertStage final : public MapStage {
 public:
  using Options = TestInvertOptions;
  static constexpr const char* kName = "test_invert";
  static constexpr const char* kDoc = "test plugin: x -> pivot - x";
  static constexpr bool kDeterministic = true;
  TestInvertStage(Options o, nlohmann::json resolved)
      : MapStage(kName, std::move(resolved), o.keys), o_(std::move(o)) {}
  bool deterministic() const override { return true; }
  Status apply_sample(Sample& s, Rng&) const override {
    for (const auto& k : o_.keys) {
      if (!s.has(k)) return invalid_argument("test_invert: sample '" + s.id + "' has no '" + k + "'");
      s.at(k) = s.at(k).neg().add(o_.pivot);
    }
    return Status::ok();
  }

 private:
  Options o_;
};

}  // namespace

SEGFLOW_PLUGIN_ABI()

SEGFLOW_PLUGIN_REGISTER(registry) { return add_stage<TestInvertStage>(*registry).is_ok() ? 0 : 1; }
