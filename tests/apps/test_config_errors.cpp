// `segflow train` and `segflow bench` refuse a bad job config before anything is made: exit
// code 2 and one line on stderr naming the file and the key.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "test_util.hpp"

using namespace segflow::testing;
namespace fs = std::filesystem;

namespace {

/// stderr only (stdout dropped): what the user sees of a refusal.
CommandResult run_segflow_stderr(const std::string& args) {
  return run_command(shell_quote(segflow_bin()) + " " + args + " 2>&1 1>/dev/null");
}

std::size_t lines(const std::string& s) {
  return static_cast<std::size_t>(std::count(s.begin(), s.end(), '\n'));
}

}  // namespace

TEST_CASE("segflow train and bench with a bad option exit 2 with one line naming the key, making no folder") {
  TempDir dir("cli_bad_config");
  const fs::path root = dir.path() / "data" / "quick";  // data.synth would make it
  const fs::path runs = dir.path() / "runs";
  const std::string config = source_path("configs/quickstart-unet3d.yaml").string();
  const std::string where = " --set " + shell_quote("data.root=" + root.string()) + " --set " +
                            shell_quote("output.runs_dir=" + runs.string());
  struct Bad {
    std::string set;
    std::string expect;  ///< after "segflow train: "
  };
  const Bad bad[] = {
      {"model.channelz=4", config + ": model.channelz: unknown option; expected name, spatial_dims"},
      {"optimizer.lrr=0.1", config + ": optimizer.lrr: unknown option; expected name, lr, momentum"},
      {"loss.name=nope", config + ": loss.name: expected one of dice, ce, bce, dice_ce"},
      {"schedule.name=sometimes", config + ": schedule.name: expected one of constant, poly, cosine"},
      {"data.synth.cases=-3", config + ": data.synth.cases: expected an integer in [1, 100000], got -3"},
      {"model.strides=[2, 2]", config + ": model.strides: expected 3 entries"},
      {"stages.1.options.a_max=-200",
       config + ": stages[1].options.a_max: expected a value different from a_min"},
  };
  for (const auto& b : bad) {
    CAPTURE(b.set);
    for (const char* cmd : {"train", "bench"}) {
      CAPTURE(cmd);
      auto r = run_segflow_stderr(std::string(cmd) + " " + shell_quote(config) + where + " --set " +
                                  shell_quote(b.set));
      CHECK(r.exit_code == 2);
      CHECK_MESSAGE(r.out.rfind("segflow " + std::string(cmd) + ": " + b.expect, 0) == 0, r.out);
      CHECK_MESSAGE(lines(r.out) == 1, r.out);
    }
  }
  CHECK_FALSE(fs::exists(root));
  CHECK_FALSE(fs::exists(root.parent_path()));
  CHECK_FALSE(fs::exists(runs));
}
