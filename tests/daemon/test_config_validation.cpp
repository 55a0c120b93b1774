// segflowd validates a whole job config at `start`: bad options in any section (and in --set)
// get an error reply naming the key, and no job, run folder or dataset is made.
#include <doctest/doctest.h>

#include "daemon/daemon_harness.hpp"

using namespace segflow::testing;
using namespace segflow::testing::daemon;

TEST_CASE("start with a bad option in any section is refused with the key named and creates no job") {
  Setup s;
  s.write_config();
  auto d = s.start();
  // data.synth would make this folder on first use: it must never appear.
  const fs::path root = s.data / "never-made";
  const std::string job = tiny_job(root, 2);
  struct Bad {
    std::string set;
    std::string expect;  ///< the error starts with this
  };
  const Bad bad[] = {
      {"optimizer.lrr=0.1", "tiny.yaml: optimizer.lrr: unknown option; expected name, lr, momentum"},
      {"model.channelz=4", "tiny.yaml: model.channelz: unknown option; expected name, spatial_dims"},
      {"loss.name=nope",
       "tiny.yaml: loss.name: expected one of dice, ce, bce, dice_ce, dice_bce, focal, "
       "dice_focal, got \"nope\""},
      {"schedule.name=sometimes",
       "tiny.yaml: schedule.name: expected one of constant, poly, cosine, got "
       "\"sometimes\""},
      {"data.synth.cases=-3", "tiny.yaml: data.synth.cases: expected an integer in [1, 100000], got -3"},
      {"model.strides=[2]", "tiny.yaml: model.strides: expected 2 entries"},  // found by the model's rules
      {"stages.1.options.spacing=[1.5, 0]",
       "tiny.yaml: stages[1].options.spacing: expected 3 positive numbers"},
  };
  for (const auto& b : bad) {
    CAPTURE(b.set);
    json r = call(s.control, {{"cmd", "start"}, {"config", job}, {"file", "tiny.yaml"}, {"set", {b.set}}});
    CHECK(r["ok"] == false);
    const std::string e = r.value("error", "");
    CHECK_MESSAGE(e.rfind(b.expect, 0) == 0, r.dump());
  }

  // The same through `segflow ctl start` with the shipped quickstart config.
  const std::string config = source_path("configs/quickstart-unet3d.yaml").string();
  auto out = run_segflow("ctl --endpoint " + s.control + " start " + shell_quote(config) +
                         " --set optimizer.lrr=0.1");
  CHECK(out.exit_code != 0);
  CHECK_MESSAGE(out.out.find(config + ": optimizer.lrr: unknown option; expected name, lr, momentum") !=
                    std::string::npos,
                out.out);
  CHECK(out.out.find("running") == std::string::npos);

  // No job exists, nothing was made, and the daemon still takes a good config.
  CHECK(ok(s.control, {{"cmd", "list"}})["jobs"].empty());
  CHECK_FALSE(fs::exists(root));
  CHECK((!fs::exists(s.state / "runs") || fs::is_empty(s.state / "runs")));  // no run folder
  json good =
      ok(s.control, {{"cmd", "start"}, {"config", job}, {"file", "tiny.yaml"}, {"set", {"train.epochs=1"}}});
  CHECK(good["job"].get<std::int64_t>() >= 1);
  CHECK(ok(s.control, {{"cmd", "list"}})["jobs"].size() == 1);
  ok(s.control, {{"cmd", "stop"}, {"job", good["job"]}});
  REQUIRE(d->alive());
}
