// ONNX out (issue 33 item 1): `segflow export --to onnx` writes a graph the ONNX checker takes
// and onnxruntime runs to segflow's eval-mode logits, for every UNet / PlainConvUNet variant,
// and a manifest from which a Python sliding-window run (tests/tools/onnx_check.py, MONAI's
// sliding_window_inference with onnxruntime as the predictor) reproduces `segflow infer`.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <fstream>

#include "actors/jobs/job_runner.hpp"
#include "job_yaml.hpp"
#include "models/interop/export.hpp"
#include "models/interop/onnx_export.hpp"
#include "models/nets/registry.hpp"
#include "models/training/job_config.hpp"
#include "models/training/trainer.hpp"
#include "pipeline/io/image.hpp"
#include "pipeline/io/image_io.hpp"
#include "test_util.hpp"

using namespace segflow;
namespace st = segflow::testing;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

/// The tiny job around `model` (not trained here: built, exported and run).
std::string onnx_job(const fs::path& dir, const std::string& model) {
  st::JobYaml job;
  job.name = "onnx";
  job.root = dir / "data";
  job.synth = "{cases: 4, size: 24, format: nifti, seed: 3}";
  job.stages = {st::kLoadStage, st::kCtWindowStage, st::kFgBgStage, st::crop_stage("[16, 16, 16]", 1, 1, 1)};
  job.model = model;
  job.schedule = "";
  job.epochs = 1;
  job.train = "batch_size: 2, device: cpu, val_interval: 1, loader: simple, threads: 1";
  job.validation = "{roi_size: [16, 16, 16], overlap: 0.25, sw_batch_size: 2}";
  job.runs_dir = dir / "runs";
  return job.yaml();
}

/// Runs tests/tools/onnx_check.py with `args`; its last printed JSON value.
json onnx_check(const std::string& args) { return st::python_tool_json("onnx_check.py", args); }

/// Real CT (TotalSegmentator's example, 3 mm) windowed to [0, 1]: a (1, 1, Z, Y, X) block of
/// the given size from the middle of the volume.
at::Tensor real_ct_block(int64_t z, int64_t y, int64_t x) {
  REQUIRE_OK_AND_ASSIGN(auto img,
                        pipeline::read_image(st::testdata_path("totalsegmentator/example_ct_sm.nii.gz")));
  at::Tensor v = img.voxels.to(at::kFloat);
  const int64_t z0 = (v.size(1) - z) / 2, y0 = (v.size(2) - y) / 2, x0 = (v.size(3) - x) / 2;
  v = v.slice(1, z0, z0 + z).slice(2, y0, y0 + y).slice(3, x0, x0 + x);
  return ((v + 200.0) / 500.0).clamp(0.0, 1.0).unsqueeze(0);
}

struct Variant {
  std::string name, model;
};

}  // namespace

TEST_CASE(
    "segflow's ONNX export: every UNet, PlainConvUNet and ResEncUNet variant gives segflow's eval logits "
    "in "
    "onnxruntime") {
  st::TempDir dir("export_onnx_variants");
  const std::vector<Variant> variants = {
      {"unet3d_res2_batch_prelu",
       st::unet3d(5, "channels: [4, 8, 16], strides: [2, 2], num_res_units: 2, norm: batch")},
      {"unet3d_res0_instance_relu_aniso",
       st::unet3d(3,
                  "channels: [4, 8, 16], strides: [[2, 2, 1], 2], kernel_size: [3, 3, 1], up_kernel_size: "
                  "[3, 3, 1], "
                  "num_res_units: 0, norm: instance, act: relu, dropout: 0.2")},
      {"unet3d_res1_none_leaky_nobias",
       st::unet3d(
           2, "channels: [4, 8], strides: [2], num_res_units: 1, norm: none, act: leakyrelu, bias: false")},
      {"unet2d_res1_instance",
       "{name: unet, spatial_dims: 2, in_channels: 2, out_channels: 4, channels: [4, 8, 16], strides: [2, "
       "2], "
       "num_res_units: 1, norm: instance}"},
      {"plain3d_ds_aniso",
       "{name: plain_unet, spatial_dims: 3, in_channels: 2, out_channels: 3, n_stages: 3, base_features: 4, "
       "max_features: 16, strides: [1, 2, [2, 2, 1]], kernel_sizes: [3, 3, [3, 3, 1]], deep_supervision: "
       "true}"},
      {"plain2d_batch",
       "{name: plain_unet, spatial_dims: 2, in_channels: 1, out_channels: 2, n_stages: 3, base_features: 4, "
       "max_features: 8, norm: batch, deep_supervision: false}"},
      {"res_enc3d_ds_aniso",  // stage 1 pools and projects its skip, stage 2 only pools
       "{name: res_enc_unet, spatial_dims: 3, in_channels: 2, out_channels: 3, n_stages: 3, base_features: "
       "4, "
       "max_features: 8, strides: [1, 2, [2, 2, 1]], kernel_sizes: [3, 3, [3, 3, 1]], n_blocks_per_stage: "
       "[1, 2, 2], deep_supervision: true}"},
      {"res_enc2d_batch",
       "{name: res_enc_unet, spatial_dims: 2, in_channels: 1, out_channels: 2, n_stages: 3, base_features: "
       "4, "
       "max_features: 16, norm: batch, deep_supervision: false}"},
  };
  const at::Tensor real = real_ct_block(8, 16, 24);  // (1, 1, 8, 16, 24)
  std::string pairs;
  std::vector<std::string> names;
  for (const Variant& v : variants) {
    CAPTURE(v.name);
    REQUIRE_OK_AND_ASSIGN(auto cfg, models::parse_job_config(onnx_job(dir.path(), v.model), "job.yaml"));
    REQUIRE_OK_AND_ASSIGN(auto t, models::Trainer::create(cfg, c10::Device(c10::kCPU)));
    auto& module = t->model().module();
    const auto& info = t->model().info();
    {
      torch::NoGradGuard no_grad;  // running statistics and affine norms away from 0/1, so that they count
      auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
      for (auto& b : module.named_buffers())
        if (b.key().find("running_") != std::string::npos)
          b.value().copy_(at::rand(b.value().sizes(), gen) + 0.5);
      for (auto& p : module.named_parameters())
        if (p.key().find("norm.") != std::string::npos)
          p.value().add_(at::randn(p.value().sizes(), gen) * 0.2);
    }
    module.eval();
    // Batch of 2: the real CT block and noise; 2D models get its middle slice.
    at::Tensor x = at::cat({real, at::randn_like(real)}, 0).repeat({1, info.in_channels, 1, 1, 1});
    if (info.spatial_dims == 2) x = x.select(2, 4).contiguous();
    torch::NoGradGuard no_grad;
    const at::Tensor y = t->model().predict(x);
    const fs::path onnx = dir / (v.name + ".onnx"), io = dir / (v.name + ".io.pt");
    REQUIRE_OK(models::write_onnx_model(cfg.model, module, onnx, {}));
    const std::vector<char> bytes = models::pytorch_state_dict_bytes({{"x", x}, {"y", y}});
    std::ofstream(io, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    pairs += " " + st::shell_quote(onnx.string() + ":" + io.string());
    names.push_back(v.name);
    if (v.name == "plain3d_ds_aniso") {  // fp16 weights, float32 compute
      const fs::path half = dir / (v.name + "_fp16.onnx");
      REQUIRE_OK(models::write_onnx_model(cfg.model, module, half, {17, true}));
      pairs += " " + st::shell_quote(half.string() + ":" + io.string());
      names.push_back(v.name + "_fp16");
    }
  }
  {  // On a network whose weights outweigh the graph, fp16 weights halve the file.
    REQUIRE_OK_AND_ASSIGN(auto cfg, models::parse_job_config(onnx_job(dir.path(),
                                                                      "{name: plain_unet, spatial_dims: 3, "
                                                                      "n_stages: 3, base_features: 16, "
                                                                      "max_features: 64}"),
                                                             "job.yaml"));
    REQUIRE_OK_AND_ASSIGN(auto t, models::Trainer::create(cfg, c10::Device(c10::kCPU)));
    REQUIRE_OK(models::write_onnx_model(cfg.model, t->model().module(), dir / "big.onnx", {}));
    REQUIRE_OK(models::write_onnx_model(cfg.model, t->model().module(), dir / "big_fp16.onnx", {17, true}));
    MESSAGE("plain_unet 16-64: " << fs::file_size(dir / "big.onnx") << " bytes, fp16 weights "
                                 << fs::file_size(dir / "big_fp16.onnx"));
    CHECK(fs::file_size(dir / "big_fp16.onnx") < fs::file_size(dir / "big.onnx") * 55 / 100);
  }
  const json results = onnx_check("logits" + pairs);
  REQUIRE(results.size() == names.size());
  for (std::size_t i = 0; i < names.size(); ++i) {
    CAPTURE(names[i]);
    const double diff = results[i]["max_abs_diff"], max = results[i]["max_abs"];
    MESSAGE(names[i] << ": onnxruntime vs segflow max |diff| " << diff << " of max |logit| " << max);
    CHECK(max > 0);
    // fp16 weights round each weight to 11 significant bits.
    const bool fp16 = names[i].ends_with("_fp16");
    CHECK(diff <= (fp16 ? 2e-2 : 1e-4) * max);
  }
  CHECK_FALSE(st::has_temporaries(dir.path()));
}

TEST_CASE(
    "segflow export --to onnx: a trained UNet's manifest drives a Python sliding window to segflow infer's "
    "labels") {
  st::TempDir dir("export_onnx_trained");
  const fs::path config = dir / "job.yaml";
  st::write_file(config,
                 onnx_job(dir.path(), st::unet3d(5,
                                                 "channels: [4, 8, 16], strides: [2, 2], num_res_units: 1, "
                                                 "norm: batch")));
  REQUIRE_OK_AND_ASSIGN(auto cfg, models::load_job_config(config));
  models::TrainObserver quiet;
  REQUIRE_OK_AND_ASSIGN(auto run, actors::run_training(cfg, {}, quiet));
  const std::string bin = st::shell_quote(st::segflow_bin());
  const fs::path onnx = dir / "out" / "unet.onnx";
  fs::create_directories(onnx.parent_path());
  auto r = st::run_command(bin + " export --checkpoint " + st::shell_quote(run / "best.pt") + " --to onnx " +
                           st::shell_quote(onnx) + " 2>&1");
  REQUIRE_MESSAGE(r.exit_code == 0, r.out);
  const json printed = json::parse(r.out.substr(r.out.rfind('{')));
  CHECK(printed["family"] == "unet");
  CHECK(printed["opset"] == 17);
  const json manifest = json::parse(st::read_file(dir / "out" / "unet.manifest.json"));
  CHECK(manifest["model"]["file"] == "unet.onnx");
  CHECK(manifest["model"]["size_divisors"] == json::array({4, 4, 4}));
  CHECK(manifest["model"]["output"]["channels"] == 5);
  CHECK(manifest["classes"].size() == 5);
  CHECK(manifest["inference"]["roi_size"] == json::array({16, 16, 16}));
  CHECK(manifest["inference"]["overlap"] == 0.25);
  CHECK(manifest["inference"]["blend"] == "gaussian");
  REQUIRE(manifest["preprocessing"]["stages"].size() == 3);  // load, window, fg_bg_indices: before the crop
  CHECK(manifest["preprocessing"]["stages"][1]["name"] == "scale_intensity_range");
  CHECK(manifest["preprocessing"]["summary"]["intensity"].size() == 1);
  CHECK(manifest["preprocessing"]["summary"]["spacing"].is_null());

  // A synthetic case of the training data and real CT (122 x 101 x 30, sizes no window divides).
  const fs::path synthetic = dir / "data" / "imagesTr" / "case_000_0000.nii.gz";
  const fs::path real = st::testdata_path("totalsegmentator/example_ct_sm.nii.gz");
  for (const fs::path& input : {synthetic, real}) {
    CAPTURE(input);
    const fs::path seg = dir / (input.stem().stem().string() + "_seg.nii.gz");
    auto inf = st::run_command(bin + " infer --checkpoint " + st::shell_quote(run / "best.pt") + " --input " +
                               st::shell_quote(input) + " --output " + st::shell_quote(seg) +
                               " --device cpu --quiet 2>&1");
    REQUIRE_MESSAGE(inf.exit_code == 0, inf.out);
    const json j = onnx_check("infer " + st::shell_quote(dir / "out" / "unet.manifest.json") + " " +
                              st::shell_quote(input) + " " + st::shell_quote(seg));
    MESSAGE(input.filename().string() << ": onnxruntime + manifest vs segflow infer: " << j.dump());
    CHECK(j["voxels"].get<int64_t>() >= 9000);
    CHECK(j["agreement"].get<double>() > 0.999);
  }

  // A model package: every member exported, with ensemble.json; the member's manifest drives
  // the same agreement with `segflow infer --model`.
  auto pk = st::run_command(bin + " package " + st::shell_quote(run) + " --out " +
                            st::shell_quote(dir / "pkg") + " 2>&1");
  REQUIRE_MESSAGE(pk.exit_code == 0, pk.out);
  auto ex = st::run_command(bin + " export --model " + st::shell_quote(dir / "pkg") + " --to onnx " +
                            st::shell_quote(dir / "pkg_onnx") + " 2>&1");
  REQUIRE_MESSAGE(ex.exit_code == 0, ex.out);
  const json ensemble = json::parse(st::read_file(dir / "pkg_onnx" / "ensemble.json"));
  REQUIRE(ensemble["members"].size() == 1);
  const std::string member_manifest = ensemble["members"][0]["manifest"];
  CHECK(fs::exists(dir / "pkg_onnx" / ensemble["members"][0]["onnx"].get<std::string>()));
  CHECK(ensemble["classes"].size() == 5);
  const fs::path pseg = dir / "pkg_seg.nii.gz";
  auto inf = st::run_command(bin + " infer --model " + st::shell_quote(dir / "pkg") + " --input " +
                             st::shell_quote(synthetic) + " --output " + st::shell_quote(pseg) +
                             " --device cpu --quiet 2>&1");
  REQUIRE_MESSAGE(inf.exit_code == 0, inf.out);
  const json pj = onnx_check("infer " + st::shell_quote(dir / "pkg_onnx" / member_manifest) + " " +
                             st::shell_quote(synthetic) + " " + st::shell_quote(pseg));
  CHECK(pj["agreement"].get<double>() > 0.999);
  auto again = st::run_command(bin + " export --model " + st::shell_quote(dir / "pkg") + " --to onnx " +
                               st::shell_quote(dir / "pkg_onnx") + " 2>&1");
  CHECK(again.exit_code == 2);
  CHECK_MESSAGE(again.out.find("already exists") != std::string::npos, again.out);
  CHECK_FALSE(st::has_temporaries(dir.path()));
}

TEST_CASE("segflow export --to onnx: bad input gets an error naming it and leaves nothing behind") {
  st::TempDir dir("export_onnx_bad");
  const std::string bin = st::shell_quote(st::segflow_bin());
  auto run = [&](const std::string& args) { return st::run_command(bin + " export " + args + " 2>&1"); };
  // (A SAM is exported as two graphs: tests/apps/test_export_onnx_sam.cpp.)
  // An opset the ONNX library does not check, through the API and the CLI.
  REQUIRE_OK_AND_ASSIGN(auto ucfg,
                        models::parse_job_config(onnx_job(dir.path(), st::unet3d(2,
                                                                                 "channels: [4, 8], "
                                                                                 "strides: [2]")),
                                                 "job.yaml"));
  REQUIRE_OK_AND_ASSIGN(auto u, models::Trainer::create(ucfg, c10::Device(c10::kCPU)));
  const Status old = models::write_onnx_model(ucfg.model, u->model().module(), dir / "u.onnx", {12, false});
  CHECK_MESSAGE(old.message().find("opset 12: expected 13..17") != std::string::npos, old.message());
  CHECK_FALSE(fs::exists(dir / "u.onnx"));
  auto opset = run("--checkpoint x.pt --to onnx " + st::shell_quote(dir / "o.onnx") + " --opset 19");
  CHECK(opset.exit_code == 2);
  CHECK_MESSAGE(opset.out.find("--opset: expected 13..17, got 19") != std::string::npos, opset.out);
  auto ext = run("--checkpoint x.pt --to onnx " + st::shell_quote(dir / "o.pt"));
  CHECK(ext.exit_code == 2);
  CHECK_MESSAGE(ext.out.find("expected a .onnx file") != std::string::npos, ext.out);
  auto both = run("--checkpoint x.pt --model m --to onnx " + st::shell_quote(dir / "o.onnx"));
  CHECK(both.exit_code == 2);
  CHECK_MESSAGE(both.out.find("one of --checkpoint or --model") != std::string::npos, both.out);
  auto missing = run("--checkpoint " + st::shell_quote(dir / "nope.pt") + " --to onnx " +
                     st::shell_quote(dir / "o.onnx"));
  CHECK(missing.exit_code != 0);
  CHECK_MESSAGE(missing.out.find("nope.pt") != std::string::npos, missing.out);
  auto no_package =
      run("--model " + st::shell_quote(dir / "nopkg") + " --to onnx " + st::shell_quote(dir / "pkg_out"));
  CHECK(no_package.exit_code != 0);
  CHECK_MESSAGE(no_package.out.find("nopkg") != std::string::npos, no_package.out);
  CHECK_FALSE(fs::exists(dir / "o.onnx"));
  CHECK_FALSE(fs::exists(dir / "pkg_out"));
  CHECK_FALSE(st::has_temporaries(dir.path()));
}
