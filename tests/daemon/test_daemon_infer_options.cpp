// Every option of `segflow infer` reaches segflowd: `segflow ctl infer` with the same flags
// queues a job that writes what `segflow infer` writes, its status shows the options, the
// stored request survives a restart, and a bad option is refused naming the field.
#include <doctest/doctest.h>

#include <torch/torch.h>

#include "daemon/daemon_harness.hpp"
#include "models/training/checkpoint.hpp"
#include "pipeline/io/image_io.hpp"

using namespace segflow::testing;
using namespace segflow::testing::daemon;

namespace {

torch::Tensor voxels(const fs::path& file) {
  auto img = segflow::pipeline::read_image(file);
  REQUIRE_MESSAGE(img.is_ok(), img.status().message());
  return img->voxels;
}

}  // namespace

TEST_CASE("ctl infer takes every option of segflow infer and writes what segflow infer writes") {
  Setup s;
  const fs::path checkpoint = train_checkpoint(s);
  REQUIRE_OK_AND_ASSIGN(json meta, segflow::models::read_checkpoint_meta(checkpoint));
  std::string names;
  for (const auto& n : meta["class_names"]) names += (names.empty() ? "" : ",") + n.get<std::string>();
  REQUIRE_FALSE(names.empty());
  const fs::path scan = s.data / "tiny" / "imagesTr" / "case_001_0000.nii.gz";
  REQUIRE(fs::exists(scan));
  // An ensemble (the checkpoint twice), mirroring, a smaller overlap, host stitching, class
  // names, float32, no channels-last, no postprocessing and the probabilities.
  const std::string q = shell_quote(checkpoint.string());
  const std::string flags = "--checkpoint " + q + " --checkpoint " + q + " --input " +
                            shell_quote(scan.string()) +
                            " --device cpu --tta mirror --overlap 0.25 --stitch-device cpu --class-names " +
                            names + " --amp none --channels-last off --postprocess none --save-probabilities";
  const fs::path cli_out = s.dir / "cli" / "seg.nii.gz";
  fs::create_directories(cli_out.parent_path());
  auto cli = run_segflow("infer " + flags + " --output " + shell_quote(cli_out.string()), s.dir.path());
  REQUIRE_MESSAGE(cli.exit_code == 0, cli.err);

  s.write_config();
  auto d = s.start();
  const fs::path daemon_out = s.dir / "daemon" / "seg.nii.gz";
  fs::create_directories(daemon_out.parent_path());
  // The daemon's job also writes an NRRD of the same prediction (--also-output).
  const fs::path daemon_nrrd = s.dir / "daemon" / "seg.nrrd";
  auto sent = run_segflow("ctl --endpoint " + s.control + " --json infer " + flags + " --output " +
                              shell_quote(daemon_out.string()) + " --also-output " +
                              shell_quote(daemon_nrrd.string()),
                          s.dir.path());
  REQUIRE_MESSAGE(sent.exit_code == 0, (sent.out + sent.err));
  const auto id = json::parse(sent.out)["job"].get<std::int64_t>();
  const json done = wait_job(*d, s.control, id, "completed", 120);

  // The job ran with the options: the status shows them and the files equal the CLI's.
  CHECK(done["overlap"] == 0.25);
  CHECK(done["tta"] == "mirror");
  CHECK(done["amp"] == "none");
  CHECK(done["stitch_device"] == "cpu");
  CHECK(done["channels_last"] == false);
  CHECK(done["save_probabilities"] == true);
  CHECK(done["postprocess"] == "none");
  CHECK(done["ensemble"] == json::array({checkpoint.string()}));
  CHECK(done["class_names"].size() == meta["class_names"].size());
  REQUIRE(fs::exists(daemon_out));
  CHECK(torch::equal(voxels(daemon_out), voxels(cli_out)));
  CHECK(done["also_output"] == json::array({daemon_nrrd.string()}));
  REQUIRE(fs::exists(daemon_nrrd));
  CHECK(torch::equal(voxels(daemon_nrrd).to(torch::kLong), voxels(cli_out).to(torch::kLong)));
  const fs::path probs = s.dir / "daemon" / "seg_probabilities.nii.gz";
  REQUIRE(fs::exists(probs));
  CHECK(torch::allclose(voxels(probs), voxels(s.dir / "cli" / "seg_probabilities.nii.gz"), 1e-5, 1e-6));

  // Refused at submission with the field's own error, as the command line refuses the flag.
  json bad = call(s.control, {{"cmd", "infer"},
                              {"checkpoint", checkpoint.string()},
                              {"input", scan.string()},
                              {"output", (s.dir / "x.nii.gz").string()},
                              {"overlap", 1.5}});
  CHECK(bad["ok"] == false);
  CHECK_MESSAGE(bad["error"].get<std::string>().rfind("overlap: expected a number in [0, 1)", 0) == 0,
                bad.dump());
  bad = call(s.control, {{"cmd", "infer"},
                         {"checkpoint", checkpoint.string()},
                         {"input", scan.string()},
                         {"output", (s.dir / "x.nii.gz").string()},
                         {"format", "png"}});
  CHECK(bad["ok"] == false);
  CHECK_MESSAGE(bad["error"] == "format: expected nifti or seg, got \"png\"", bad.dump());
  bad = call(s.control, {{"cmd", "infer"},
                         {"checkpoint", checkpoint.string()},
                         {"input", scan.string()},
                         {"output", (s.dir / "x.nii.gz").string()},
                         {"also_output", json::array({(s.dir / "nowhere" / "x.nrrd").string()})}});
  CHECK(bad["ok"] == false);
  CHECK_MESSAGE(bad["error"] == "also_output: " + (s.dir / "nowhere" / "x.nrrd").string() + ": its folder " +
                                    (s.dir / "nowhere").string() + " does not exist",
                bad.dump());
  auto refused = run_segflow("ctl --endpoint " + s.control + " infer --checkpoint " + q + " --input " +
                                 shell_quote(scan.string()) + " --output " +
                                 shell_quote((s.dir / "y.nii.gz").string()) + " --channels-last maybe",
                             s.dir.path());
  CHECK(refused.exit_code == 2);
  CHECK_MESSAGE(contains(refused.err, "--channels-last: expected on or off, got 'maybe'"), refused.err);
  CHECK_FALSE(fs::exists(s.dir / "x.nii.gz"));
  CHECK_FALSE(fs::exists(s.dir / "y.nii.gz"));

  // The stored request is read back after a restart: the job's options are still its own.
  ok(s.control, {{"cmd", "shutdown"}});
  REQUIRE_MESSAGE(d->wait_exit(60) == 0, d->log_tail());
  d = s.start("restarted.log");
  const json again = job_status(s.control, id);
  CHECK(again["state"] == "completed");
  CHECK(again["overlap"] == 0.25);
  CHECK(again["save_probabilities"] == true);
  CHECK(again["ensemble"] == json::array({checkpoint.string()}));
}
