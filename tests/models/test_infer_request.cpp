// The inference request's one table and one binding (models/inference/infer_request.hpp):
// every field of the table is read by the binding and written back by to_json, a value of the
// wrong kind is refused naming the field, and the rules between fields hold. And the one
// label-map writer of inference (models::write_label_map), chosen by the format table.
#include <doctest/doctest.h>

#include <map>
#include <set>

#include <torch/torch.h>

#include "models/inference/infer_request.hpp"
#include "pipeline/io/image.hpp"
#include "pipeline/io/image_formats.hpp"
#include "pipeline/io/image_io.hpp"
#include "test_util.hpp"

using segflow::models::InferRequest;
using segflow::models::read_infer_request;
using json = nlohmann::json;

namespace {

/// A value other than the default for each field, by key.
const std::map<std::string, json>& samples() {
  static const std::map<std::string, json> s = {
      {"checkpoint", json::array({"/r/a/best.pt", "/r/b/best.pt"})},
      {"model", "/m"},
      {"input", "/in/ct.nii.gz"},
      {"output", "/out"},
      {"also_output", json::array({"/out/seg.nii.gz", "/out/seg.nrrd"})},
      {"device", "cpu"},
      {"tta", "mirror-all"},
      {"format", "seg"},
      {"class_names", json::array({"background", "liver"})},
      {"amp", "bf16"},
      {"overlap", 0.25},
      {"blend", "nnunet"},
      {"stitch_device", "cpu"},
      {"postprocess", "/p/postprocessing.json"},
      {"channels_last", true},
      {"save_probabilities", true},
      {"no_postprocess", true},
      {"boxes", "/b/boxes.json"},
      {"boxes_from", "/b/labels.nii.gz"},
      {"propagate", true},
      {"box_margin", 5},
  };
  return s;
}

}  // namespace

TEST_CASE("every field of the inference request's table is bound: read, then written back alike") {
  std::set<std::string> keys;
  for (const auto& f : segflow::models::infer_fields()) {
    const std::string key(f.key);
    keys.insert(key);
    INFO(key);
    REQUIRE_MESSAGE(samples().count(key) == 1, "a new field needs a sample value here");
    CHECK(segflow::models::flag_name(f.key).find('_') == std::string::npos);
    // The field alone (with what a field needs beside it to be valid).
    json given = {{key, samples().at(key)}};
    if (key == "propagate" || key == "box_margin") given["boxes"] = "/b/boxes.json";
    auto r = read_infer_request(given, "");
    REQUIRE_MESSAGE(r.is_ok(), r.status().message());
    const json back = r->to_json();
    REQUIRE(back.contains(key));
    CHECK(back[key] == given[key]);
    // Read back from its JSON form: the same request.
    auto again = read_infer_request(back, "");
    REQUIRE_MESSAGE(again.is_ok(), again.status().message());
    CHECK(again->to_json() == back);
  }
  CHECK(keys.size() == samples().size());
}

TEST_CASE("an inference request refuses values of the wrong kind and broken rules, naming the field") {
  auto refused = [](const json& fields) {
    auto r = read_infer_request(fields, "");
    REQUIRE_FALSE(r.is_ok());
    return r.status().message();
  };
  CHECK(refused({{"overlap", 1.0}}).rfind("overlap: expected a number in [0, 1)", 0) == 0);
  CHECK(refused({{"overlap", "half"}}).rfind("overlap: expected", 0) == 0);
  CHECK(refused({{"tta", "flips"}}) == "tta: expected none, mirror or mirror-all, got \"flips\"");
  CHECK(refused({{"amp", "fp8"}}) == "amp: expected auto, none, bf16 or fp16, got \"fp8\"");
  CHECK(refused({{"box_margin", -1}, {"boxes", "/b.json"}}).rfind("box_margin: expected", 0) == 0);
  CHECK(refused({{"save_probabilities", "yes"}}).rfind("save_probabilities: expected", 0) == 0);
  CHECK(segflow::testing::contains(refused({{"bogus", 1}}), "bogus: unknown field"));
  // The rules between fields.
  CHECK(segflow::testing::contains(refused({{"model", "/m"}, {"checkpoint", "/c.pt"}}),
                                   "model: a package names its checkpoints"));
  CHECK(segflow::testing::contains(refused({{"model", "/m"}, {"tta", "mirror"}}),
                                   "model: a package sets its TTA"));
  CHECK(segflow::testing::contains(refused({{"model", "/m"}, {"postprocess", "none"}}), "postprocess: "));
  CHECK(refused({{"propagate", true}}) ==
        "boxes or boxes_from: expected one of them for box-prompted inference");
  CHECK(segflow::testing::contains(refused({{"boxes", "/b.json"}, {"overlap", 0.5}}),
                                   "overlap: a sliding-window"));
  CHECK(segflow::testing::contains(refused({{"boxes", "/b.json"}, {"checkpoint", {"/a.pt", "/b.pt"}}}),
                                   "checkpoint: box prompts take one checkpoint"));
  // A single checkpoint may be a string; keys of the caller pass when named.
  auto one = read_infer_request({{"checkpoint", "/c.pt"}, {"trigger", "auto_infer"}}, "", {"trigger"});
  REQUIRE_MESSAGE(one.is_ok(), one.status().message());
  CHECK(one->options.checkpoint == "/c.pt");
  CHECK(one->options.ensemble.empty());
}

TEST_CASE("the postprocessing of a request: the one beside the checkpoint unless none or a package") {
  segflow::testing::TempDir dir("infer_request_pp");
  const auto run = dir.path() / "run";
  std::filesystem::create_directories(run);
  InferRequest r;
  r.options.checkpoint = run / "best.pt";
  CHECK(r.postprocess_file().empty());  // none beside it
  segflow::testing::write_file(run / "postprocessing.json", "{}");
  CHECK(r.postprocess_file() == run / "postprocessing.json");
  CHECK(r.run_options().postprocess_file == run / "postprocessing.json");
  r.postprocess = "none";
  CHECK(r.postprocess_file().empty());
  r.postprocess = "/elsewhere/plan.json";
  CHECK(r.postprocess_file() == "/elsewhere/plan.json");
  InferRequest package;
  package.options.model = dir.path() / "model";
  CHECK(package.postprocess_file().empty());  // the package applies its own
}

TEST_CASE("one label-map writer: every format of the table that writes, read back voxel for voxel") {
  segflow::testing::TempDir dir("label_map_writer");
  segflow::pipeline::Image input;
  input.voxels = torch::zeros({1, 4, 5, 6});
  input.geometry.spacing = {0.8, 0.9, 2.5};
  input.geometry.origin = {-10.0, 20.0, 5.0};
  const torch::Tensor labels = torch::randint(0, 3, {1, 4, 5, 6}, torch::TensorOptions().dtype(torch::kByte));
  int formats = 0;
  for (const auto& f : segflow::pipeline::image_formats()) {
    if (!f.write) continue;
    ++formats;
    const auto out = dir.path() / ("labels" + f.extensions.front());
    INFO(out.string());
    REQUIRE_OK(segflow::models::write_label_map(out, input, labels, {}, {"background", "a", "b"}));
    REQUIRE_OK_AND_ASSIGN(auto back, segflow::pipeline::read_image(out));
    CHECK(torch::equal(back.voxels.to(torch::kLong), labels.to(torch::kLong)));
    CHECK(segflow::geometry_close(back.geometry, input.geometry, 1e-4));
  }
  CHECK(formats >= 3);  // NIfTI, NRRD, MetaImage
  // An ending no writer claims is refused before anything is written, naming what would do.
  const auto bad = segflow::models::write_label_map(dir.path() / "labels.png", input, labels, {}, {});
  REQUIRE_FALSE(bad.is_ok());
  CHECK(segflow::testing::contains(bad.message(), ".nrrd"));
  CHECK_FALSE(std::filesystem::exists(dir.path() / "labels.png"));
}
