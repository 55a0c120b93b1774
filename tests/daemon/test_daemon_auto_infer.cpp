// segflowd auto_infer: a dataset names a checkpoint that the daemon runs on each case that
// arrives in the watched folder, once per case and file version, with the results and the
// failures in the events stream; a bad auto_infer entry stops the daemon at start.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <set>

#include "daemon/daemon_harness.hpp"
#include "daemon/infer_fixtures.hpp"

using namespace segflow::testing;
using namespace segflow::testing::daemon;

TEST_CASE("auto_infer runs a dataset's model once on each new case and reports results and failures") {
  Setup s;
  const fs::path checkpoint = train_checkpoint(s);

  // The watched dataset already holds one case when the daemon starts: it is inferred too.
  make_dataset(s.data, "incoming", 1, 21);
  const fs::path out = s.dir / "seg";
  s.write_config("auto_infer:\n  - dataset: incoming\n    checkpoint: " + checkpoint.string() +
                 "\n    output: " + out.string() + "\n    tta: mirror\n" +
                 "    save_probabilities: true\n    overlap: 0.25\n");  // options of segflow infer
  auto d = s.start();
  Events events(s.events, "job.");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let the subscription reach the PUB socket
  REQUIRE_MESSAGE(eventually([&] { return fs::exists(out / "case_000.nii.gz"); }, 60), d->log_tail());

  // A new image (no label: what arrives for inference) dropped into the watched folder.
  const fs::path images = s.data / "incoming" / "imagesTr";
  const fs::path scan = images / "arrived_0000.nii.gz";
  drop_file(s.dir / "aside.nii.gz", s.data / "tiny" / "imagesTr" / "case_002_0000.nii.gz", "", scan);
  auto done = events.wait_for(
      [](const std::string&, const json& b) {
        return b.value("case", "") == "arrived" && b["state"] == "completed";
      },
      60);
  REQUIRE_MESSAGE(done.has_value(), d->log_tail());
  CHECK((*done)["trigger"] == "auto_infer");
  CHECK((*done)["dataset"] == "incoming");
  CHECK((*done)["kind"] == "infer");
  const fs::path pred = out / "arrived.nii.gz";
  REQUIRE((*done)["outputs"].size() == 1);
  CHECK((*done)["outputs"][0]["output"] == pred.string());
  REQUIRE(fs::exists(pred));
  check_same_grid(scan, pred);
  const json labels = reference_read("sitk", pred);
  CHECK(labels["min"].get<double>() >= 0);
  CHECK(labels["max"].get<double>() <= 4);  // 5 classes
  const json st = job_status(s.control, (*done)["job"].get<std::int64_t>());
  CHECK(st["input"] == scan.string());  // the image, not a label
  CHECK(st["tta"] == "mirror");
  CHECK(st["trigger"] == "auto_infer");
  // The rule's options of segflow infer reach the job: stored, shown and applied.
  CHECK(st["overlap"] == 0.25);
  CHECK(st["save_probabilities"] == true);
  CHECK(fs::exists(out / "arrived_probabilities.nii.gz"));

  // A corrupt case: one failed job, in the events, not submitted again on later rescans.
  drop_file(s.dir / "aside.nii.gz", {}, "not a NIfTI file at all", images / "broken_0000.nii.gz");
  auto failed =
      events.wait_for([](const std::string&,
                         const json& b) { return b.value("case", "") == "broken" && b["state"] == "failed"; },
                      60);
  REQUIRE_MESSAGE(failed.has_value(), d->log_tail());
  CHECK_MESSAGE((*failed)["reason"].get<std::string>().find("broken_0000.nii.gz") != std::string::npos,
                failed->dump());
  std::this_thread::sleep_for(std::chrono::seconds(5));  // two rescans (rescan_interval_s: 2)
  events.drain(200);
  std::map<std::string, std::set<std::int64_t>> jobs_of_case;
  for (const auto& [topic, body] : events.got)
    if (body.value("trigger", "") == "auto_infer")
      jobs_of_case[body["case"].get<std::string>()].insert(body["job"].get<std::int64_t>());
  CHECK(jobs_of_case["arrived"].size() == 1);
  CHECK(jobs_of_case["broken"].size() == 1);
  CHECK(!fs::exists(out / "broken.nii.gz"));
  // The training job, the case present at start, the arrived case and the broken one.
  const json list = ok(s.control, {{"cmd", "list"}})["jobs"];
  CHECK_MESSAGE(list.size() == 4, list.dump());
  ok(s.control, {{"cmd", "shutdown"}});
  REQUIRE(d->wait_exit(60) == 0);

  // After a restart the failed case is not submitted again (the jobs are in the state
  // database) until its file changes: a readable image in its place then runs once.
  d = s.start("segflowd2.log");
  Events events2(s.events, "job.");
  std::this_thread::sleep_for(std::chrono::seconds(4));  // indexed at start, polled every second
  CHECK_MESSAGE(ok(s.control, {{"cmd", "list"}})["jobs"].size() == 4, d->log_tail());
  drop_file(s.dir / "aside.nii.gz", s.data / "tiny" / "imagesTr" / "case_004_0000.nii.gz", "",
            images / "broken_0000.nii.gz");
  auto fixed = events2.wait_for(
      [](const std::string&, const json& b) {
        return b.value("case", "") == "broken" && b["state"] == "completed";
      },
      60);
  REQUIRE_MESSAGE(fixed.has_value(), d->log_tail());
  CHECK(fs::exists(out / "broken.nii.gz"));
  CHECK(ok(s.control, {{"cmd", "list"}})["jobs"].size() == 5);
  ok(s.control, {{"cmd", "shutdown"}});
  CHECK(d->wait_exit(60) == 0);
}

TEST_CASE("a bad auto_infer entry stops segflowd at start with a message naming the key") {
  Setup s;
  const fs::path real = s.dir / "model.pt";
  write_file(real, "a file that exists");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"  - {dataset: incoming, checkpoint: " + (s.dir / "missing.pt").string() + "}\n",
       "auto_infer[0].checkpoint: " + (s.dir / "missing.pt").string() + ": no such file"},
      {"  - {dataset: incoming, checkpoint: " + real.string() + ", tta: sideways}\n", "auto_infer[0].tta: "},
      {"  - {dataset: incoming, checkpoint: " + real.string() + ", bogus: 1}\n",
       "auto_infer[0].bogus: unknown key"},
      {"  - {checkpoint: " + real.string() + "}\n", "auto_infer[0].dataset: missing"},
      {"  - {dataset: a, checkpoint: " + real.string() + "}\n  - {dataset: a, checkpoint: " + real.string() +
           "}\n",
       "auto_infer[1].dataset: "},
  };
  int n = 0;
  for (const auto& [entry, message] : bad) {
    const auto& yaml_entry = entry;  // clang 14 cannot capture a structured binding
    CAPTURE(yaml_entry);
    s.write_config("auto_infer:\n" + entry);
    const fs::path log = s.dir / ("bad" + std::to_string(n++) + ".log");
    ChildProcess d = start_segflowd({"--config", s.config.string()}, log);
    CHECK(d.wait_exit(60) == 2);  // segflowd: 2 = bad config
    CHECK_MESSAGE(d.log_tail().find(message) != std::string::npos, d.log_tail());
  }
}
