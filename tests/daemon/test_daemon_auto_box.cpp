// segflowd auto_infer with a box-prompted (sam) checkpoint: each case that arrives in the
// watched folder takes its prompts from its box file (<dataset>/boxes/<case id>.json|.csv) or
// from its label map (with 3D propagation), and the label map written equals `segflow infer
// --boxes / --boxes-from` on the same files (a DICOM series: the SEG too); a case without a
// box file is a failed event, the daemon goes on, and the case runs once its box file arrives;
// a corrected box file makes a series' label map and SEG again. And auto_infer
// with a model package: what `segflow infer --model` writes.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <map>

#include "daemon/daemon_harness.hpp"
#include "daemon/infer_fixtures.hpp"
#include "pipeline/io/image_io.hpp"

using namespace segflow::testing;
using namespace segflow::testing::daemon;

namespace {

/// The voxels of a label map (int64).
at::Tensor auto_box_voxels(const fs::path& file) {
  auto img = segflow::pipeline::read_image(file);
  REQUIRE_MESSAGE(img.is_ok(), file.string());
  return img->voxels.to(torch::kLong);
}

/// Runs `segflow infer ARGS --output OUT --device cpu`, which must succeed; OUT's voxels.
at::Tensor cli_infer(const std::string& args, const fs::path& out) {
  auto r = run_segflow("infer " + args + " --output " + shell_quote(out.string()) + " --device cpu");
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  return auto_box_voxels(out);
}

/// The first auto_infer event of case `id` (since the subscription) that is `event` or, with
/// `or_failed`, failed; fails unless it is `event`.
json wait_case_event(Events& events, ChildProcess& d, const std::string& id, const std::string& event,
                     bool or_failed = true) {
  auto e = events.wait_for(
      [&](const std::string&, const json& b) {
        return b.value("case", "") == id && (b["event"] == event || (or_failed && b["event"] == "failed"));
      },
      90);
  REQUIRE_MESSAGE(e.has_value(), ("no " + event + " event for " + id + "\n" + d.log_tail()));
  REQUIRE_MESSAGE((*e)["event"] == event, (e->dump() + "\n" + d.log_tail()));
  return *e;
}

}  // namespace

TEST_CASE("auto_infer runs a box-prompted checkpoint on each arriving case with its box file or label map") {
  Setup s;
  const fs::path scans = s.dir / "scans";
  auto made =
      run_segflow("synth --cases 3 --size 32 --format nifti --seed 9 --out " + shell_quote(scans.string()));
  REQUIRE_MESSAGE(made.exit_code == 0, made.out);
  const fs::path sam = daemon_box_checkpoint(scans, s.dir / "sam.pt", true);
  auto scan = [&](int i) { return scans / "imagesTr" / ("case_00" + std::to_string(i) + "_0000.nii.gz"); };

  // Two watched datasets: box files in incoming/boxes/ (the default boxes_dir), label maps
  // in labelled/labelsTr/ propagated from their middle slices.
  const fs::path incoming = s.data / "incoming", labelled = s.data / "labelled";
  for (const fs::path& p :
       {incoming / "imagesTr", incoming / "boxes", labelled / "imagesTr", labelled / "labelsTr"})
    fs::create_directories(p);
  fs::create_directories(s.data / "series");
  const fs::path out = s.dir / "out", out2 = s.dir / "out2", out3 = s.dir / "out3";
  s.write_config("auto_infer:\n  - {dataset: incoming, checkpoint: " + sam.string() + ", output: " +
                 out.string() + ", prompts: boxes}\n  - {dataset: labelled, checkpoint: " + sam.string() +
                 ", output: " + out2.string() + ", prompts: label_map, propagate: true, box_margin: 2}\n" +
                 "  - {dataset: series, checkpoint: " + sam.string() + ", output: " + out3.string() +
                 ", prompts: boxes, boxes_dir: " + (s.dir / "series_boxes").string() +
                 ", output_format: both, quiet_seconds: 0}\n");
  auto d = s.start();
  Events events(s.events, "auto_infer");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let the subscription reach the PUB socket
  const fs::path aside = s.dir / "aside";

  // case_a: its box file (CSV), then its image.
  const fs::path boxes_a = s.dir / "a.csv";
  write_file(boxes_a, "label,slice,x0,y0,x1,y1\n1,9,4,6,20,22\n2,9,12,10,28,30\n1,12,6,6,22,24\n");
  drop_file(aside, boxes_a, "", incoming / "boxes" / "case_a.csv");
  drop_file(aside, scan(0), "", incoming / "imagesTr" / "case_a_0000.nii.gz");
  const json a = wait_case_event(events, *d, "case_a", "inferred");
  REQUIRE(a["outputs"].size() == 1);
  CHECK(a["outputs"][0] == (out / "case_a.nii.gz").string());
  check_same_grid(scan(0), out / "case_a.nii.gz");
  const json job_a = job_status(s.control, a["jobs"][0].get<std::int64_t>());
  CHECK(job_a["boxes"] == (incoming / "boxes" / "case_a.csv").string());
  CHECK(job_a["input"] == (incoming / "imagesTr" / "case_a_0000.nii.gz").string());
  const at::Tensor got_a = auto_box_voxels(out / "case_a.nii.gz");
  CHECK(got_a.gt(0).sum().item<std::int64_t>() > 0);
  CHECK(torch::equal(
      got_a, cli_infer("--checkpoint " + shell_quote(sam.string()) + " --input " +
                           shell_quote(scan(0).string()) + " --boxes " + shell_quote(boxes_a.string()),
                       s.dir / "cli_a.nii.gz")));

  // case_b arrives without a box file: a failed event naming the file looked for, no job.
  drop_file(aside, scan(1), "", incoming / "imagesTr" / "case_b_0000.nii.gz");
  const json b = wait_case_event(events, *d, "case_b", "failed");
  CHECK(b["stage"] == "prompts");
  CHECK_MESSAGE(
      contains(b["error"].get<std::string>(),
               (incoming / "boxes").string() + ": no box file case_b.json or case_b.csv for case case_b"),
      b.dump());
  CHECK(!fs::exists(out / "case_b.nii.gz"));

  // The daemon goes on: a case of the other dataset, its label map first, then its image.
  const fs::path label_c = scans / "labelsTr" / "case_002.nii.gz";
  drop_file(aside, label_c, "", labelled / "labelsTr" / "case_c.nii.gz");
  drop_file(aside, scan(2), "", labelled / "imagesTr" / "case_c_0000.nii.gz");
  const json c = wait_case_event(events, *d, "case_c", "inferred");
  CHECK(c["dataset"] == "labelled");
  const json job_c = job_status(s.control, c["jobs"][0].get<std::int64_t>());
  CHECK(job_c["boxes_from"] == (labelled / "labelsTr" / "case_c.nii.gz").string());
  CHECK(job_c["propagate"] == true);
  const at::Tensor got_c = auto_box_voxels(out2 / "case_c.nii.gz");
  CHECK(got_c.gt(0).sum().item<std::int64_t>() > 0);
  CHECK(torch::equal(got_c, cli_infer("--checkpoint " + shell_quote(sam.string()) + " --input " +
                                          shell_quote(scan(2).string()) + " --boxes-from " +
                                          shell_quote(label_c.string()) + " --propagate --box-margin 2",
                                      s.dir / "cli_c.nii.gz")));

  // case_b's box file (JSON) arrives late: the case runs now.
  const fs::path boxes_b = s.dir / "b.json";
  write_file(
      boxes_b,
      R"({"space": "voxel", "boxes": [{"label": 1, "slice": 14, "x0": 5, "y0": 5, "x1": 25, "y1": 26}]})");
  drop_file(aside, boxes_b, "", incoming / "boxes" / "case_b.json");
  wait_case_event(events, *d, "case_b", "inferred", false);  // its failure above is in the stream too
  CHECK(
      torch::equal(auto_box_voxels(out / "case_b.nii.gz"),
                   cli_infer("--checkpoint " + shell_quote(sam.string()) + " --input " +
                                 shell_quote(scan(1).string()) + " --boxes " + shell_quote(boxes_b.string()),
                             s.dir / "cli_b.nii.gz")));

  // A DICOM series whose box file is in a boxes_dir outside data_root: a NIfTI label map and
  // a SEG, each what `segflow infer --boxes` writes for the series.
  const fs::path boxes_d = s.dir / "series_boxes" / "case_d.json";
  fs::create_directories(boxes_d.parent_path());
  write_file(boxes_d, R"({"boxes": [{"label": 1, "slice": 10, "x0": 4, "y0": 6, "x1": 20, "y1": 22}]})");
  const fs::path dicom = s.dir / "dicom";
  made =
      run_segflow("synth --cases 1 --size 32 --format dicom --seed 9 --out " + shell_quote(dicom.string()));
  REQUIRE_MESSAGE(made.exit_code == 0, made.out);
  fs::copy(dicom / "case_000", s.dir / "series_copy", fs::copy_options::recursive);
  fs::rename(s.dir / "series_copy", s.data / "series" / "case_d");
  const json e = wait_case_event(events, *d, "case_d", "inferred");
  REQUIRE(e["outputs"].size() == 2);
  // One job wrote both: the model ran once.
  REQUIRE(e["jobs"].size() == 1);
  const json job_d = job_status(s.control, e["jobs"][0].get<std::int64_t>());
  CHECK(job_d["output"] == (out3 / "case_d.dcm").string());
  CHECK(job_d["also_output"] == json::array({(out3 / "case_d.nii.gz").string()}));
  CHECK(torch::equal(
      auto_box_voxels(out3 / "case_d.nii.gz"),
      cli_infer("--checkpoint " + shell_quote(sam.string()) + " --input " +
                    shell_quote((dicom / "case_000").string()) + " --boxes " + shell_quote(boxes_d.string()),
                s.dir / "cli_d.nii.gz")));
  const at::Tensor seg_cli =
      cli_infer("--checkpoint " + shell_quote(sam.string()) + " --input " +
                    shell_quote((dicom / "case_000").string()) + " --boxes " + shell_quote(boxes_d.string()),
                s.dir / "cli_d.dcm");
  CHECK(torch::equal(auto_box_voxels(out3 / "case_d.dcm"), seg_cli));
  const std::string labels_py =
      "import sys, json, pydicom\n"
      "print(json.dumps([str(x.SegmentLabel) for x in pydicom.dcmread(sys.argv[1]).SegmentSequence]))\n";
  const json names = json::parse(run_python(labels_py, {(out3 / "case_d.dcm").string()}));
  CHECK(!names.empty());
  CHECK(names == json::parse(run_python(labels_py, {(s.dir / "cli_d.dcm").string()})));

  // A corrected box file for the series: a new label map and SEG, from the new boxes.
  const fs::path boxes_d2 = s.dir / "d2.json";
  write_file(boxes_d2, R"({"boxes": [{"label": 1, "slice": 12, "x0": 8, "y0": 8, "x1": 26, "y1": 24}]})");
  drop_file(aside, boxes_d2, "", boxes_d);
  auto inferred_d = [&] {
    int n = 0;
    for (const auto& [topic, body] : events.got) n += body["case"] == "case_d" && body["event"] == "inferred";
    return n;
  };
  REQUIRE_MESSAGE(eventually(
                      [&] {
                        events.drain(100);
                        return inferred_d() == 2;
                      },
                      90),
                  d->log_tail());
  CHECK(torch::equal(
      auto_box_voxels(out3 / "case_d.nii.gz"),
      cli_infer("--checkpoint " + shell_quote(sam.string()) + " --input " +
                    shell_quote((dicom / "case_000").string()) + " --boxes " + shell_quote(boxes_d2.string()),
                s.dir / "cli_d2.nii.gz")));
  CHECK_FALSE(
      torch::equal(auto_box_voxels(s.dir / "cli_d.nii.gz"), auto_box_voxels(s.dir / "cli_d2.nii.gz")));

  // Each case ran once (case_d twice), case_b failed once.
  std::this_thread::sleep_for(std::chrono::seconds(3));  // a rescan (rescan_interval_s: 2)
  events.drain(200);
  std::map<std::string, int> received, failed;
  for (const auto& [topic, body] : events.got) {
    if (body["event"] == "received") ++received[body["case"].get<std::string>()];
    if (body["event"] == "received" && body["case"] == "case_d")
      CHECK(body["prompt_file"] == boxes_d.string());
    if (body["event"] == "failed") ++failed[body["case"].get<std::string>()];
  }
  CHECK(received == std::map<std::string, int>{{"case_a", 1}, {"case_b", 1}, {"case_c", 1}, {"case_d", 2}});
  CHECK(failed == std::map<std::string, int>{{"case_b", 1}});
  CHECK(inferred_d() == 2);
  CHECK(ok(s.control, {{"cmd", "list"}})["jobs"].size() == 5);  // case_d: one job (NIfTI and SEG), twice
  ok(s.control, {{"cmd", "shutdown"}});
  CHECK(d->wait_exit(60) == 0);
}

TEST_CASE("auto_infer runs a model package on an arriving case as segflow infer --model does") {
  Setup s;
  const fs::path checkpoint = train_checkpoint(s);
  const fs::path package = s.dir / "package";
  auto packed = run_segflow("package " + shell_quote(checkpoint.parent_path().string()) + " --out " +
                            shell_quote(package.string()));
  REQUIRE_MESSAGE(packed.exit_code == 0, packed.out);
  fs::create_directories(s.data / "incoming" / "imagesTr");
  const fs::path out = s.dir / "out";
  s.write_config("auto_infer:\n  - {dataset: incoming, model: " + package.string() +
                 ", output: " + out.string() + "}\n");
  auto d = s.start();
  Events events(s.events, "auto_infer");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));

  const fs::path scan = s.data / "tiny" / "imagesTr" / "case_002_0000.nii.gz";
  drop_file(s.dir / "aside.nii.gz", scan, "", s.data / "incoming" / "imagesTr" / "arrived_0000.nii.gz");
  const json e = wait_case_event(events, *d, "arrived", "inferred");
  REQUIRE(e["outputs"].size() == 1);
  CHECK(e["outputs"][0] == (out / "arrived.nii.gz").string());
  const json st = job_status(s.control, e["jobs"][0].get<std::int64_t>());
  CHECK(st["model"] == package.string());
  check_same_grid(scan, out / "arrived.nii.gz");
  ok(s.control, {{"cmd", "shutdown"}});
  CHECK(d->wait_exit(60) == 0);

  const at::Tensor local = cli_infer(
      "--model " + shell_quote(package.string()) + " --input " + shell_quote(scan.string()) + " --quiet",
      s.dir / "local.nii.gz");
  CHECK(torch::equal(auto_box_voxels(out / "arrived.nii.gz"), local));
}
