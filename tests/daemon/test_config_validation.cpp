// segflowd validates a whole job config at `start`: bad options in any section (and in --set)
// get an error reply naming the key, and no job, run folder or dataset is made.
#include <doctest/doctest.h>

#include "daemon/config.hpp"
#include "daemon/daemon_harness.hpp"
#include "daemon/infer_fixtures.hpp"

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

TEST_CASE("auto_infer prompt options are checked against the checkpoint at start, naming the field") {
  Setup s;
  auto made = run_segflow("synth --cases 1 --size 32 --format nifti --seed 9 --out " +
                          shell_quote((s.dir / "scans").string()));
  REQUIRE_MESSAGE(made.exit_code == 0, made.out);
  const std::string sam = daemon_box_checkpoint(s.dir / "scans", s.dir / "sam.pt", true).string();
  const std::string unet = daemon_box_checkpoint(s.dir / "scans", s.dir / "unet.pt", false).string();
  fs::create_directories(s.dir / "package");
  const std::string pkg = (s.dir / "package").string();
  auto check = [&](const std::string& entry) -> std::string {
    auto cfg = segflow::daemon::parse_daemon_config(
        "data_root: " + s.data.string() + "\nauto_infer:\n  - " + entry + "\n", "daemon.yaml");
    if (!cfg.is_ok()) return cfg.status().message();
    segflow::Status st = segflow::daemon::finalize_daemon_config(*cfg);
    return st.is_ok() ? std::string() : st.message();
  };
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{dataset: a, checkpoint: " + sam + "}",
       "daemon.yaml: auto_infer[0].prompts: missing: " + sam +
           " is a box-prompted (sam) checkpoint; expected prompts: boxes"},
      {"{dataset: a, checkpoint: " + unet + ", prompts: boxes}",
       "daemon.yaml: auto_infer[0].prompts: " + unet + " is not a box-prompted (sam) checkpoint"},
      {"{dataset: a, checkpoint: " + sam + ", prompts: box}", "auto_infer[0].prompts: expected one of"},
      {"{dataset: a, checkpoint: " + unet + ", propagate: true}",
       "auto_infer[0].propagate: used only with prompts: boxes or label_map"},
      {"{dataset: a, checkpoint: " + sam + ", prompts: boxes, box_margin: 2}",
       "auto_infer[0].box_margin: used only with propagate: true"},
      {"{dataset: a, checkpoint: " + sam + ", prompts: label_map, propagate: true, box_margin: -1}",
       "auto_infer[0].box_margin: "},
      {"{dataset: a, checkpoint: " + sam + ", prompts: label_map, boxes_dir: /tmp}",
       "auto_infer[0].boxes_dir: used only with prompts: boxes, got prompts: label_map"},
      {"{dataset: a, checkpoint: " + sam + ", prompts: boxes, tta: mirror}",
       "auto_infer[0].tta: box-prompted inference has no TTA"},
      {"{dataset: a, model: " + pkg + ", prompts: boxes}",
       "auto_infer[0].prompts: a model package holds no box-prompted model"},
  };
  for (const auto& [entry, message] : bad) {
    const auto& yaml_entry = entry;  // clang 14 cannot capture a structured binding
    CAPTURE(yaml_entry);
    const std::string got = check(entry);
    CHECK_MESSAGE(contains(got, message), got);
  }
  // Good entries; boxes_dir defaults to the dataset's boxes/ folder.
  CHECK(check("{dataset: a, checkpoint: " + unet + "}").empty());
  CHECK(check("{dataset: a, checkpoint: " + sam + ", prompts: label_map, propagate: true, box_margin: 0}")
            .empty());
  auto cfg = segflow::daemon::parse_daemon_config("data_root: " + s.data.string() +
                                                      "\nauto_infer:\n  - {dataset: a, checkpoint: " + sam +
                                                      ", prompts: boxes}\n",
                                                  "daemon.yaml");
  REQUIRE_OK(cfg);
  REQUIRE_OK(segflow::daemon::finalize_daemon_config(*cfg));
  CHECK(cfg->auto_infer[0].boxes_dir == s.data / "a" / "boxes");

  // segflowd itself refuses to start (exit 2) with the message.
  s.write_config("auto_infer:\n  - {dataset: a, checkpoint: " + sam + "}\n");
  ChildProcess d = start_segflowd({"--config", s.config.string()}, s.dir / "bad.log");
  CHECK(d.wait_exit(60) == 2);
  CHECK_MESSAGE(contains(d.log_tail(), "auto_infer[0].prompts: missing: " + sam), d.log_tail());
}
