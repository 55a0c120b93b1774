// segflowd plans datasets: `plan` (ctl plan) writes a plan folder as a job of kind plan;
// auto_train plans and trains a dataset that appears in the watched folder, once per dataset
// signature (a restart does not train the same data again); a dataset the planner refuses
// fails its plan job with the file named while the daemon goes on; bad auto_train entries
// stop segflowd at start with the key named.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <cmath>
#include <fstream>

#include "daemon/daemon_harness.hpp"
#include "pipeline/io/image_io.hpp"
#include "pipeline/io/nifti.hpp"

using namespace segflow::testing;
using namespace segflow::testing::daemon;

namespace {

/// A synthetic dataset made at `where` (outside the watched folder), 24^3 voxels.
fs::path synth_at(const fs::path& where, int cases, int seed) {
  auto r = run_segflow("synth --cases " + std::to_string(cases) + " --size 24 --format nifti --seed " +
                       std::to_string(seed) + " --out " + shell_quote(where.string()));
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  return where;
}

/// Writes `value` into the first voxel of a NIfTI file (a label beyond dataset.json's labels,
/// or a NaN in an image).
void poke_voxel(const fs::path& file, double value) {
  auto img = segflow::pipeline::read_image(file);
  REQUIRE(img.is_ok());
  img->voxels = img->voxels.to(torch::kFloat32).contiguous();
  img->voxels.view(-1)[0] = value;
  REQUIRE(segflow::pipeline::write_nifti(file, *img).is_ok());
}

/// The first event on topic job.* of a plan job of `dataset_path` in `state`.
std::optional<json> plan_event(Events& events, const fs::path& dataset_path, const std::string& state,
                               double timeout_s) {
  return events.wait_for(
      [&](const std::string& topic, const json& b) {
        return topic.rfind("job.", 0) == 0 && b.value("kind", "") == "plan" &&
               b.value("dataset_path", "") == dataset_path.string() && b.value("state", "") == state;
      },
      timeout_s);
}

/// The run's epoch losses and validation mean Dice values from metrics.jsonl.
std::pair<std::vector<double>, std::vector<double>> losses_and_dice(const fs::path& run_dir) {
  std::vector<double> loss, dice;
  std::ifstream f(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    if (line.empty()) continue;
    const json j = json::parse(line);
    if (j.value("type", "") == "epoch") loss.push_back(j["loss"].is_number() ? j["loss"].get<double>() : NAN);
    if (j.value("type", "") == "validation")
      dice.push_back(j["mean_dice"].is_number() ? j["mean_dice"].get<double>() : NAN);
  }
  return {loss, dice};
}

const char* kAutoTrain =
    "auto_train:\n"
    "  - dataset: \"*\"\n"
    "    configuration: 3d_fullres\n"
    "    folds: [0]\n"
    "    memory_model: nnunet\n"
    "    set: {train.epochs: 1, train.steps_per_epoch: 2, train.val_interval: 1, train.batch_size: 1}\n";

}  // namespace

TEST_CASE("ctl plan writes a plan folder as a plan job; a dataset the planner refuses fails with the field") {
  Setup s;
  s.write_config();
  auto d = s.start();
  Events events(s.events, "");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let the subscription reach the PUB socket
  const fs::path ds = synth_at(s.dir / "ds", 4, 3);
  const json r = ok(s.control, {{"cmd", "plan"},
                                {"dataset", ds.string()},
                                {"configurations", {"3d_fullres"}},
                                {"memory_model", "nnunet"},
                                {"device", "cpu"}});
  CHECK(r["kind"] == "plan");
  CHECK(r["plan_dir"] == (ds / ".segflow-plans").string());
  const std::int64_t id = r["job"].get<std::int64_t>();
  const json done = wait_job(*d, s.control, id, "completed", 60);
  for (const char* f : {"plans.json", "fingerprint.json", "3d_fullres.yaml"})
    CHECK_MESSAGE(fs::exists(ds / ".segflow-plans" / f), f);
  CHECK(done["kind"] == "plan");
  CHECK(done["configurations"] == json::array({"3d_fullres"}));
  CHECK(done["excluded"].empty());
  CHECK(done["dataset_path"] == ds.string());
  auto planned = events.wait_for(
      [&](const std::string& t, const json& b) {
        return t == "metrics." + std::to_string(id) && b.value("type", "") == "planned";
      },
      10);
  REQUIRE(planned.has_value());
  CHECK((*planned)["plan_dir"] == (ds / ".segflow-plans").string());

  // No labels: the planner refuses the dataset; the job fails with the field named.
  const fs::path bare = synth_at(s.dir / "bare", 2, 4);
  fs::remove_all(bare / "labelsTr");
  const std::int64_t bad =
      ok(s.control, {{"cmd", "plan"}, {"dataset", bare.string()}})["job"].get<std::int64_t>();
  const json failed = wait_job(*d, s.control, bad, "failed", 60);
  CHECK_MESSAGE(
      failed["reason"].get<std::string>().find("labels: expected a label map per case") != std::string::npos,
      failed.dump());
  CHECK(ok(s.control, {{"cmd", "ping"}})["ok"] == true);

  // Requests checked before a job exists, the field named.
  json e = call(s.control, {{"cmd", "plan"}, {"dataset", (s.dir / "nowhere").string()}});
  CHECK(e["ok"] == false);
  CHECK_MESSAGE(e["error"].get<std::string>().rfind("dataset: " + (s.dir / "nowhere").string(), 0) == 0,
                e.dump());
  e = call(s.control, {{"cmd", "plan"}, {"dataset", ds.string()}, {"configurations", {"4d"}}});
  CHECK_MESSAGE(e["error"].get<std::string>().rfind("configurations: ", 0) == 0, e.dump());
  e = call(s.control, {{"cmd", "train"}, {"dataset", ds.string()}, {"folds", {"two"}}});
  CHECK_MESSAGE(e["error"].get<std::string>().rfind("folds: ", 0) == 0, e.dump());
  e = call(s.control, {{"cmd", "plan"}, {"dataset", ds.string()}, {"preset", "resenc-s"}});
  CHECK_MESSAGE(e["error"].get<std::string>() ==
                    "preset: expected one of default, resenc-m, resenc-l, resenc-xl, got 'resenc-s'",
                e.dump());
  CHECK(ok(s.control, {{"cmd", "list"}})["jobs"].size() == 2);

  // nnU-Net's residual encoder preset: the plan's network is its ResidualEncoderUNet.
  const std::int64_t res = ok(s.control, {{"cmd", "plan"},
                                          {"dataset", ds.string()},
                                          {"out", (s.dir / "resenc").string()},
                                          {"configurations", {"3d_fullres"}},
                                          {"memory_model", "nnunet"},
                                          {"preset", "resenc-m"},
                                          {"device", "cpu"}})["job"]
                               .get<std::int64_t>();
  wait_job(*d, s.control, res, "completed", 60);
  std::ifstream pj(s.dir / "resenc" / "plans.json");
  const json plans = json::parse(pj);
  CHECK(plans["segflow"]["preset"] == "resenc-m");
  CHECK(plans["configurations"]["3d_fullres"]["architecture"]["network_class_name"] ==
        "dynamic_network_architectures.architectures.unet.ResidualEncoderUNet");
  ok(s.control, {{"cmd", "shutdown"}});
  CHECK(d->wait_exit(60) == 0);
}

TEST_CASE(
    "auto_train plans and trains a dropped dataset once, reports a bad one and skips both after a restart") {
  Setup s;
  s.write_config(kAutoTrain);
  auto d = s.start();
  Events events(s.events, "job.");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));

  make_dataset(s.data, "good", 4, 5);
  const fs::path good = s.data / "good";
  auto planned = plan_event(events, good, "completed", 60);
  REQUIRE_MESSAGE(planned.has_value(), d->log_tail());
  CHECK((*planned)["trigger"] == "auto_train");
  REQUIRE((*planned)["train_jobs"].size() == 1);
  const std::int64_t train = (*planned)["train_jobs"][0].get<std::int64_t>();
  const json trained = wait_job(*d, s.control, train, "completed", 120);
  const fs::path run = trained["run_dir"].get<std::string>();
  CHECK(fs::exists(run / "plan" / "3d_fullres.yaml"));
  CHECK(fs::exists(run / "plan" / "plans.json"));
  const auto [loss, dice] = losses_and_dice(run);
  REQUIRE(loss.size() == 1);
  CHECK(std::isfinite(loss[0]));
  REQUIRE(!dice.empty());
  for (double v : dice) CHECK((std::isfinite(v) && v >= 0 && v <= 1));

  // A bad dataset: one label value beyond dataset.json's labels, one NaN voxel: every case is
  // left out, the plan job fails naming the file, and the daemon goes on.
  const fs::path aside = synth_at(s.dir / "bad.partial", 2, 6);
  poke_voxel(aside / "labelsTr" / "case_000.nii.gz", 9);
  poke_voxel(aside / "imagesTr" / "case_001_0000.nii.gz", NAN);
  fs::rename(aside, s.data / "bad");
  auto failed = plan_event(events, s.data / "bad", "failed", 60);
  REQUIRE_MESSAGE(failed.has_value(), d->log_tail());
  const std::string why = (*failed)["reason"].get<std::string>();
  CHECK_MESSAGE((why.find("case_000.nii.gz: label values") != std::string::npos ||
                 why.find("case_001_0000.nii.gz: voxels") != std::string::npos),
                why);
  CHECK(ok(s.control, {{"cmd", "ping"}})["ok"] == true);
  CHECK(ok(s.control, {{"cmd", "list"}})["jobs"].size() == 3);  // plan good, train good, plan bad
  ok(s.control, {{"cmd", "shutdown"}});
  REQUIRE(d->wait_exit(60) == 0);

  // A restart: the same data is neither planned nor trained again (the sweep runs every 10 s).
  d = s.start("segflowd2.log");
  std::this_thread::sleep_for(std::chrono::seconds(13));
  CHECK_MESSAGE(ok(s.control, {{"cmd", "list"}})["jobs"].size() == 3, d->log_tail());
  ok(s.control, {{"cmd", "shutdown"}});
  CHECK(d->wait_exit(60) == 0);
}

TEST_CASE("a bad auto_train entry stops segflowd at start with a message naming the key") {
  Setup s;
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"  - {dataset: a, configuration: 4d}\n", "auto_train[0].configuration: "},
      {"  - {dataset: a, folds: [-1]}\n", "auto_train[0].folds: "},
      {"  - {dataset: a, folds: some}\n", "auto_train[0].folds: "},
      {"  - {dataset: a, folds: []}\n", "auto_train[0].folds: "},
      {"  - {dataset: a, set: {train.epochz: 1}}\n", "train.epochz"},
      {"  - {dataset: a, set: {train.epochs: -1}}\n", "train.epochs"},
      {"  - {configuration: 2d}\n", "auto_train[0].dataset: missing"},
      {"  - {dataset: /elsewhere/a}\n", "auto_train[0].dataset: expected a folder of data_root"},
      {"  - {dataset: a, bogus: 1}\n", "auto_train[0].bogus: unknown key"},
      {"  - {dataset: a}\n  - {dataset: a}\n", "auto_train[1].dataset: "},
  };
  int n = 0;
  for (const auto& [entry, message] : bad) {
    const auto& yaml_entry = entry;  // clang 14 cannot capture a structured binding
    CAPTURE(yaml_entry);
    s.write_config("auto_train:\n" + entry);
    const fs::path log = s.dir / ("bad" + std::to_string(n++) + ".log");
    ChildProcess d = start_segflowd({"--config", s.config.string()}, log);
    CHECK(d.wait_exit(60) == 2);  // segflowd: 2 = bad config
    CHECK_MESSAGE(d.log_tail().find(message) != std::string::npos, d.log_tail());
  }
}
