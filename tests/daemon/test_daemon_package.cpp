// segflowd inference with a model package (`segflow ctl infer --model`): the job runs the
// package's members with its postprocessing and writes what `segflow infer --model` writes;
// a package with a changed file is refused at submission naming the file.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <fstream>

#include "daemon/daemon_harness.hpp"
#include "pipeline/io/image_io.hpp"

using namespace segflow::testing;
using namespace segflow::testing::daemon;

namespace {

at::Tensor package_labels(const fs::path& file) {
  auto img = segflow::pipeline::read_image(file);
  REQUIRE_MESSAGE(img.is_ok(), file.string());
  return img->voxels.to(torch::kLong);
}

/// Packages the run of `checkpoint` with a plan keeping the largest foreground component into
/// DIR/model, and a copy with one byte of its checkpoint changed into DIR/tampered; the
/// tampered checkpoint's path.
fs::path make_packages(const fs::path& dir, const fs::path& checkpoint) {
  write_file(dir / "largest.json", R"({"metric": "dice", "classes": [1, 2, 3, 4], "steps": [
      {"kind": "keep_largest", "class": "foreground", "kept": true}]})");
  auto r = run_segflow("package " + shell_quote(checkpoint.parent_path()) + " --out " +
                       shell_quote(dir / "model") + " --postprocessing " + shell_quote(dir / "largest.json"));
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  fs::copy(dir / "model", dir / "tampered", fs::copy_options::recursive);
  fs::path victim;
  for (const auto& e : fs::recursive_directory_iterator(dir / "tampered"))
    if (e.path().extension() == ".pt") victim = e.path();
  REQUIRE(!victim.empty());
  std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(fs::file_size(victim) / 2));
  f.put('\x33');
  return victim;
}

}  // namespace

TEST_CASE("ctl infer --model runs a package with its postprocessing, as segflow infer --model does") {
  Setup s;
  const fs::path checkpoint = train_checkpoint(s);
  const fs::path victim = make_packages(s.dir.path(), checkpoint);
  auto d = s.start();
  const std::string ctl = "ctl --endpoint " + s.control + " ";
  const fs::path scan = s.data / "tiny" / "imagesTr" / "case_000_0000.nii.gz";

  // Refused at submission: a changed file, a checkpoint as well as a model.
  auto out = run_segflow(ctl + "infer --model " + shell_quote(s.dir / "tampered") + " --input " +
                         shell_quote(scan) + " --output " + shell_quote(s.dir / "x.nii.gz"));
  CHECK(out.exit_code == 1);
  CHECK_MESSAGE(contains(out.out, "model: " + victim.string() + ": sha256"), out.out);
  json bad = call(s.control, {{"cmd", "infer"},
                              {"model", (s.dir / "model").string()},
                              {"checkpoint", checkpoint.string()},
                              {"input", scan.string()},
                              {"output", (s.dir / "x.nii.gz").string()}});
  CHECK(bad["ok"] == false);
  CHECK(contains(bad["error"].get<std::string>(), "model: a package names its checkpoints"));
  CHECK(ok(s.control, {{"cmd", "list"}})["jobs"].size() == 1);  // the training job only

  // A dataset through the package.
  const fs::path preds = s.dir / "preds";
  out = run_segflow(ctl + "--json infer --model " + shell_quote(s.dir / "model") + " --input " +
                    shell_quote(s.data / "tiny") + " --output " + shell_quote(preds));
  REQUIRE_MESSAGE(out.exit_code == 0, out.out);
  const auto job = json::parse(out.out)["job"].get<std::int64_t>();
  const json st = wait_job(*d, s.control, job, "completed", 180);
  CHECK(st["model"] == (s.dir / "model").string());
  REQUIRE(st["outputs"].size() == 5);
  ok(s.control, {{"cmd", "shutdown"}});
  CHECK(d->wait_exit(60) == 0);

  // The same label maps as segflow infer --model.
  auto local = run_segflow("infer --model " + shell_quote(s.dir / "model") + " --input " +
                           shell_quote(s.data / "tiny") + " --output " + shell_quote(s.dir / "local") +
                           " --device cpu --quiet");
  REQUIRE_MESSAGE(local.exit_code == 0, local.out);
  for (const auto& o : st["outputs"]) {
    const fs::path p = o["output"].get<std::string>();
    CHECK_MESSAGE(torch::equal(package_labels(p), package_labels(s.dir / "local" / p.filename())),
                  p.string());
  }
}
