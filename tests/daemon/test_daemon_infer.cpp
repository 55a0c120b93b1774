// segflowd inference jobs (`segflow ctl infer`): validated at submission, queued beside a
// training job on the same device, run to label maps on the input's grid, reported in
// status, list and the event stream.
#include <doctest/doctest.h>

#include <cmath>
#include <set>

#include "daemon/daemon_harness.hpp"
#include "models/training/checkpoint.hpp"
#include "models/training/class_names.hpp"
#include "models/training/job_config.hpp"
#include "pipeline/io/dataset.hpp"

using namespace segflow::testing;
using namespace segflow::testing::daemon;

namespace {

/// A synthetic MSD dataset NAME under `root` (written aside, then renamed into place).
void make_infer_dataset(const fs::path& root, const std::string& name, int cases) {
  fs::create_directories(root);
  const fs::path partial = root / (name + ".partial");
  auto r = run_segflow("synth --cases " + std::to_string(cases) +
                       " --size 24 --format nifti --seed 9 --out " + shell_quote(partial.string()));
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  fs::rename(partial, root / name);
}

}  // namespace

// One daemon, one story (validate, queue beside training, run, write): longer than a screen
// because each step needs the state the one before left in the running daemon.
TEST_CASE("an inference job sent with ctl infer is validated, queued beside training and writes label maps") {
  Setup s;
  s.write_config();
  make_infer_dataset(s.data, "tiny", 5);
  auto d = s.start();
  Events events(s.events);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let the subscription reach the PUB socket
  const std::string ctl = "ctl --endpoint " + s.control + " ";
  const fs::path scan = s.data / "tiny" / "imagesTr" / "case_000_0000.nii.gz";
  REQUIRE(fs::exists(scan));

  // Refused at submission, naming the field and the file; nothing is stored.
  const fs::path missing = s.dir / "nope" / "best.pt";
  auto out =
      run_segflow(ctl + "infer --checkpoint " + shell_quote(missing.string()) + " --input " +
                  shell_quote(scan.string()) + " --output " + shell_quote((s.dir / "x.nii.gz").string()));
  CHECK(out.exit_code == 1);
  CHECK_MESSAGE(out.out.find("checkpoint: " + missing.string()) != std::string::npos, out.out);
  const fs::path not_a_checkpoint = s.dir / "garbage.pt";
  write_file(not_a_checkpoint, "this is no checkpoint");
  json bad = call(s.control, {{"cmd", "infer"},
                              {"checkpoint", not_a_checkpoint.string()},
                              {"input", scan.string()},
                              {"output", (s.dir / "x.nii.gz").string()}});
  CHECK(bad["ok"] == false);
  CHECK_MESSAGE(
      bad["error"].get<std::string>().find("checkpoint: " + not_a_checkpoint.string()) != std::string::npos,
      bad.dump());
  CHECK(ok(s.control, {{"cmd", "list"}})["jobs"].empty());

  // A short training job gives the checkpoint.
  const auto train =
      ok(s.control,
         {{"cmd", "start"}, {"config", tiny_job(s.data / "tiny", 1)}, {"file", "tiny.yaml"}})["job"]
          .get<std::int64_t>();
  const json trained = wait_job(*d, s.control, train, "completed", 180);
  const fs::path checkpoint = fs::path(trained["run_dir"].get<std::string>()) / "last.pt";
  REQUIRE(fs::exists(checkpoint));
  // The model the daemon trained carries its classes, named as the training named them
  // (dataset.json through the job's stages): inference never looks for the dataset again.
  REQUIRE_OK_AND_ASSIGN(json meta, segflow::models::read_checkpoint_meta(checkpoint));
  REQUIRE(meta.contains("class_names"));
  REQUIRE_OK_AND_ASSIGN(auto trained_cfg,
                        segflow::models::job_config_from_json(meta["config"], "meta.config"));
  const auto expected_names =
      segflow::models::job_class_names(trained_cfg, segflow::pipeline::dataset_label_names(s.data / "tiny"));
  REQUIRE_FALSE(expected_names.empty());
  CHECK(meta["class_names"] == json(expected_names));

  // More field errors, now with a good checkpoint.
  bad = call(s.control, {{"cmd", "infer"},
                         {"checkpoint", checkpoint.string()},
                         {"input", (s.dir / "no-such-scan.nii.gz").string()},
                         {"output", (s.dir / "x.nii.gz").string()}});
  CHECK(bad["ok"] == false);
  CHECK(bad["error"].get<std::string>().find("input: ") == 0);
  bad = call(s.control, {{"cmd", "infer"},
                         {"checkpoint", checkpoint.string()},
                         {"input", scan.string()},
                         {"output", (s.dir / "x.nii.gz").string()},
                         {"tta", "sideways"}});
  CHECK(bad["ok"] == false);
  CHECK(bad["error"].get<std::string>().find("tta: ") == 0);
  bad = call(s.control, {{"cmd", "infer"},
                         {"checkpoint", checkpoint.string()},
                         {"input", scan.string()},
                         {"output", (s.dir / "no-such-folder" / "x.nii.gz").string()}});
  CHECK(bad["ok"] == false);
  CHECK(bad["error"].get<std::string>().find("output: ") == 0);
  CHECK(ok(s.control, {{"cmd", "list"}})["jobs"].size() == 1);

  // A long training job holds the one CPU device: inference waits in the same queue.
  const auto busy =
      ok(s.control,
         {{"cmd", "start"}, {"config", tiny_job(s.data / "tiny", 400)}, {"file", "long.yaml"}})["job"]
          .get<std::int64_t>();
  wait_job(*d, s.control, busy, "running", 120);

  // One scan through the client.
  const fs::path pred = s.dir / "pred.nii.gz";
  out = run_segflow(ctl + "--json infer --checkpoint " + shell_quote(checkpoint.string()) + " --input " +
                    shell_quote(scan.string()) + " --output " + shell_quote(pred.string()) + " --tta mirror");
  REQUIRE_MESSAGE(out.exit_code == 0, out.out);
  const auto one = json::parse(out.out)["job"].get<std::int64_t>();
  CHECK(one == busy + 1);  // the same id sequence as training jobs
  std::this_thread::sleep_for(std::chrono::seconds(1));
  CHECK(job_status(s.control, one)["state"] == "queued");
  ok(s.control, {{"cmd", "stop"}, {"job", busy}});
  wait_job(*d, s.control, busy, "stopped", 120);
  json st = wait_job(*d, s.control, one, "completed", 120);
  CHECK(st["kind"] == "infer");
  CHECK(st["devices"] == json::array({"cpu"}));
  REQUIRE(st["outputs"].size() == 1);
  CHECK(st["outputs"][0]["output"] == pred.string());
  REQUIRE(fs::exists(pred));
  check_same_grid(scan, pred);
  const json labels = reference_read("sitk", pred);
  CHECK(labels["min"].get<double>() >= 0);
  CHECK(labels["max"].get<double>() <= 4);  // 5 classes

  // A dataset: every case, with per-case progress events.
  const fs::path preds = s.dir / "preds";
  const auto batch = ok(s.control, {{"cmd", "infer"},
                                    {"checkpoint", checkpoint.string()},
                                    {"input", (s.data / "tiny").string()},
                                    {"output", preds.string()}})["job"]
                         .get<std::int64_t>();
  st = wait_job(*d, s.control, batch, "completed", 180);
  CHECK(st["outputs"].size() == 5);
  CHECK(st["epoch"] == 5);
  CHECK(st["epochs"] == 5);
  for (const auto& o : st["outputs"]) CHECK(fs::exists(o["output"].get<std::string>()));
  check_same_grid(s.data / "tiny" / "imagesTr" / "case_003_0000.nii.gz", preds / "case_003.nii.gz");

  // A scan that cannot be read fails the job at run time with the reason.
  const fs::path broken = s.dir / "broken.nii.gz";
  write_file(broken, "not a NIfTI file at all");
  const auto failing = ok(s.control, {{"cmd", "infer"},
                                      {"checkpoint", checkpoint.string()},
                                      {"input", broken.string()},
                                      {"output", (s.dir / "broken_seg.nii.gz").string()}})["job"]
                           .get<std::int64_t>();
  st = wait_job(*d, s.control, failing, "failed", 120);
  CHECK_MESSAGE(st["reason"].get<std::string>().find("broken.nii.gz") != std::string::npos, st.dump());

  // list and status show the kind and what was written.
  json list = ok(s.control, {{"cmd", "list"}})["jobs"];
  REQUIRE(list.size() == 5);
  CHECK(list[0]["kind"] == "train");
  CHECK(list[1]["kind"] == "train");
  CHECK(list[2]["kind"] == "infer");
  out = run_segflow(ctl + "status " + std::to_string(one));
  CHECK_MESSAGE(out.out.find(pred.string()) != std::string::npos, out.out);

  // Events: state changes on job.<id> (completed with its outputs), cases on metrics.<id>.
  events.drain(500);
  std::set<std::string> states;
  int cases_done = 0;
  bool done_with_outputs = false, failed_event = false;
  for (const auto& [topic, body] : events.got) {
    if (topic == "job." + std::to_string(one)) {
      states.insert(body["state"].get<std::string>());
      CHECK(body["kind"] == "infer");
      if (body["state"] == "completed" && body.contains("outputs"))
        done_with_outputs = body["outputs"][0]["output"] == pred.string();
    }
    if (topic == "metrics." + std::to_string(batch) && body["type"] == "case" && body["done"] == true)
      ++cases_done;
    if (topic == "job." + std::to_string(failing) && body["state"] == "failed") failed_event = true;
  }
  CHECK(states == std::set<std::string>{"queued", "running", "completed"});
  CHECK(done_with_outputs);
  CHECK(cases_done == 5);
  CHECK(failed_event);
}
