// Stage plugins: load a folder of shared libraries, use their stages in a pipeline.
#include <fstream>

#include "pipeline/plugin.hpp"
#include "stage_test_util.hpp"
#include "test_util.hpp"

using namespace segflow;
using namespace segflow::pipeline;
using namespace segflow::testing;

namespace {
const std::filesystem::path kPlugins = SEGFLOW_TEST_PLUGIN_DIR;
}

TEST_CASE("a plugin loaded from a folder adds a stage usable in a pipeline spec") {
  StageRegistry r = builtin_registry();
  REQUIRE_OK_AND_ASSIGN(auto loaded, load_plugins(kPlugins / "good", r));
  REQUIRE(loaded.size() == 1);
  CHECK(loaded.front().stages == std::vector<std::string>{"test_invert"});
  REQUIRE(r.contains("test_invert"));
  CHECK(r.info("test_invert")->origin == (kPlugins / "good" / "test_invert_plugin.so").string());
  // Described like a built-in.
  bool described = false;
  for (const auto& s : describe_stages(r))
    if (s["name"] == "test_invert")
      described = s["options"][1]["name"] == "pivot" && s["options"][1]["default"] == 1.0;
  CHECK(described);
  CHECK(format_stages(r).find("test_invert  (deterministic, cached)  [") != std::string::npos);

  auto p =
      build_pipeline(YAML::Load("[{name: test_invert, options: {pivot: 10}}, rand_flip]"), r, "job.yaml");
  REQUIRE_OK(p);
  CHECK(p->cache_boundary() == 1);
  REQUIRE_OK_AND_ASSIGN(
      auto out, p->run_deterministic(make_sample(torch::tensor({1.0f, 2.5f, -3.0f}).reshape({1, 1, 1, 3}))));
  CHECK(torch::equal(out.at("image").flatten(), torch::tensor({9.0f, 7.5f, 13.0f})));
  // Its options are validated like a built-in's.
  auto bad = build_pipeline(YAML::Load("[{name: test_invert, options: {pivot: high}}]"), r, "job.yaml");
  REQUIRE_FALSE(bad.is_ok());
  CHECK(bad.status().message() == "job.yaml: stages[0].options.pivot: expected a number, got \"high\"");
  // Loading the same plugin twice is a duplicate registration, reported with the file.
  auto again = load_plugin(kPlugins / "good" / "test_invert_plugin.so", r);
  REQUIRE_FALSE(again.is_ok());
  CHECK(again.status().message().find("test_invert_plugin.so: segflow_register_stages failed (returned 1): "
                                      "stage 'test_invert' is already registered (by ") != std::string::npos);
}

TEST_CASE("plugin loading errors name the file and what is wrong") {
  StageRegistry r = builtin_registry();
  const auto n_builtin = r.names().size();
  auto nosym = load_plugin(kPlugins / "bad" / "no_symbol_plugin.so", r);
  REQUIRE_FALSE(nosym.is_ok());
  CHECK(nosym.status().message() ==
        (kPlugins / "bad" / "no_symbol_plugin.so").string() +
            ": not a segflow plugin: no symbol 'segflow_register_stages' (declare it with "
            "SEGFLOW_PLUGIN_REGISTER from pipeline/plugin.hpp)");
  auto abi = load_plugin(kPlugins / "bad" / "abi_mismatch_plugin.so", r);
  REQUIRE_FALSE(abi.is_ok());
  CHECK(abi.status().message().find("abi_mismatch_plugin.so: plugin ABI version 999, this segflow needs 1") !=
        std::string::npos);
  auto dup = load_plugin(kPlugins / "bad" / "duplicate_stage_plugin.so", r);
  REQUIRE_FALSE(dup.is_ok());
  CHECK(dup.status().message().find("duplicate_stage_plugin.so: segflow_register_stages failed (returned 2): "
                                    "stage 'load' is already registered (by builtin)") != std::string::npos);
  CHECK_FALSE(r.contains("dup_ok"));  // rolled back
  CHECK(r.names().size() == n_builtin);

  TempDir dir("segflow_plugins");
  { std::ofstream(dir / "broken.so") << "not an ELF file"; }
  auto broken = load_plugins(dir.path(), r);
  REQUIRE_FALSE(broken.is_ok());
  CHECK(broken.status().message().find((dir / "broken.so").string() + ": dlopen failed: ") == 0);
  CHECK(load_plugins(dir / "missing", r).status().message() ==
        (dir / "missing").string() + ": no such plugin folder");
  std::filesystem::remove(dir / "broken.so");
  REQUIRE_OK_AND_ASSIGN(auto empty, load_plugins(dir.path(), r));
  CHECK(empty.empty());
}
