// `segflow ctl infer` with box prompts: a box-prompted (sam) checkpoint and a box file give
// the label map `segflow infer --boxes` gives; bad combinations are refused at submission.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include "daemon/daemon_harness.hpp"
#include "daemon/infer_fixtures.hpp"
#include "pipeline/io/image_io.hpp"

using namespace segflow::testing;
using namespace segflow::testing::daemon;

TEST_CASE("ctl infer with a box file runs a box-prompted checkpoint as segflow infer --boxes does") {
  Setup s;
  s.write_config();
  fs::create_directories(s.data);
  auto made = run_segflow("synth --cases 1 --size 32 --format nifti --seed 9 --out " +
                          shell_quote((s.dir / "scans").string()));
  REQUIRE_MESSAGE(made.exit_code == 0, made.out);
  const fs::path scan = s.dir / "scans" / "imagesTr" / "case_000_0000.nii.gz";
  const fs::path sam = daemon_box_checkpoint(s.dir / "scans", s.dir / "sam.pt", true);
  const fs::path unet = daemon_box_checkpoint(s.dir / "scans", s.dir / "unet.pt", false);
  const fs::path boxes = s.dir / "boxes.csv";
  write_file(boxes, "label,slice,x0,y0,x1,y1\n1,9,4,6,20,22\n2,9,12,10,28,30\n1,12,6,6,22,24\n");
  auto d = s.start();
  const std::string ctl = "ctl --endpoint " + s.control + " ";

  // Refused at submission, naming the field.
  const fs::path out = s.dir / "ctl.nii.gz";
  json bad = call(s.control, {{"cmd", "infer"},
                              {"checkpoint", unet.string()},
                              {"input", scan.string()},
                              {"output", out.string()},
                              {"boxes", boxes.string()}});
  CHECK(bad["error"] == "boxes: " + unet.string() + " is not a box-prompted (sam) checkpoint");
  bad = call(
      s.control,
      {{"cmd", "infer"}, {"checkpoint", sam.string()}, {"input", scan.string()}, {"output", out.string()}});
  CHECK(bad["error"] ==
        "checkpoint: " + sam.string() + ": a box-prompted model needs boxes (boxes or boxes_from)");
  bad = call(s.control, {{"cmd", "infer"},
                         {"checkpoint", sam.string()},
                         {"input", scan.string()},
                         {"output", out.string()},
                         {"boxes", boxes.string()},
                         {"boxes_from", scan.string()}});
  CHECK(bad["error"] == "boxes or boxes_from: expected one of them for box-prompted inference");
  CHECK(ok(s.control, {{"cmd", "list"}})["jobs"].empty());

  // Through the client; the same as segflow infer.
  auto r = run_segflow(ctl + "--json infer --checkpoint " + shell_quote(sam.string()) + " --input " +
                       shell_quote(scan.string()) + " --output " + shell_quote(out.string()) + " --boxes " +
                       shell_quote(boxes.string()));
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  const auto id = json::parse(r.out)["job"].get<std::int64_t>();
  const json st = wait_job(*d, s.control, id, "completed", 120);
  CHECK(st["boxes"] == boxes.string());
  REQUIRE(st["outputs"].size() == 1);
  CHECK(st["outputs"][0]["output"] == out.string());
  const fs::path cli = s.dir / "cli.nii.gz";
  auto c = run_segflow("infer --checkpoint " + shell_quote(sam.string()) + " --input " +
                       shell_quote(scan.string()) + " --output " + shell_quote(cli.string()) + " --boxes " +
                       shell_quote(boxes.string()) + " --device cpu");
  REQUIRE_MESSAGE(c.exit_code == 0, c.out);
  REQUIRE_OK_AND_ASSIGN(auto a, segflow::pipeline::read_image(out));
  REQUIRE_OK_AND_ASSIGN(auto b, segflow::pipeline::read_image(cli));
  CHECK(a.voxels.gt(0).sum().item<std::int64_t>() > 0);
  CHECK(torch::equal(a.voxels, b.voxels));
}
