// The typed job config: every section read by the one option reader, errors naming the file,
// the key and the expectation; validation that builds stages, model, loss and optimizer without
// data; the resolved config (every default filled in) and configs of older checkpoints.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "job_yaml.hpp"
#include "models/nets/unet.hpp"
#include "models/training/job_config.hpp"
#include "pipeline/stage_registry.hpp"
#include "test_util.hpp"

using namespace segflow::models;
using nlohmann::json;
using segflow::Status;
using segflow::testing::JobYaml;
using segflow::testing::kLoadStage;
using segflow::testing::kResampleStage;
using segflow::testing::stage;
using segflow::testing::TempDir;
using segflow::testing::unet3d;

namespace {

/// A small valid job; `root` is never read by these tests.
std::string base_job(const std::string& root = "/nonexistent/segflow-job-config-data") {
  JobYaml job;
  job.name = "cfgtest";
  job.seed = "1";
  job.root = root;
  job.synth = "{cases: 4, size: 24, format: nifti, seed: 9}";
  job.num_classes = "3";
  job.stages = {kLoadStage, kResampleStage,
                stage("rand_crop_pos_neg", "{spatial_size: [16, 16, 16], num_samples: 2}")};
  job.model = unet3d(3, "channels: [4, 8, 16], strides: [2, 2], num_res_units: 1, norm: batch");
  job.schedule = "{name: cosine, warmup_steps: 2}";
  job.epochs = 2;
  job.train = "batch_size: 2, device: cpu, loader: simple";
  job.validation = "{roi_size: [16, 16, 16], overlap: 0.25}";
  job.runs_dir = "/nonexistent/segflow-job-config-runs";
  return job.yaml();
}

struct BadCase {
  std::vector<std::string> set;
  std::string expect;  ///< the message starts with this: file, key, expectation
};

}  // namespace

// Longer than a screen: a table of bad options and the message each must give.
TEST_CASE("a bad option in any section of a job config names the file, the key and what was expected") {
  const BadCase cases[] = {
      // top level
      {{"bogus=1"},
       "job.yaml: bogus: unknown key; expected name, seed, data, stages, model, loss, optimizer, "
       "schedule, train, validation, output"},
      {{"name=a b"}, "job.yaml: name: expected letters, digits, '.', '_' or '-', got \"a b\""},
      {{"seed=-1"}, "job.yaml: seed: expected a non-negative integer, got -1"},
      {{"model=unet"}, "job.yaml: model: expected a mapping, got \"unet\""},
      // data
      {{"data.rot=x"},
       "job.yaml: data.rot: unknown key; expected root, synth, val_fraction, val_cases, num_classes"},
      {{"data.val_fraction=1"}, "job.yaml: data.val_fraction: expected a number in [0, 1), got 1"},
      {{"data.val_cases=-2"}, "job.yaml: data.val_cases: expected an integer >= -1, got -2"},
      // data.synth
      {{"data.synth.cases=-3"}, "job.yaml: data.synth.cases: expected an integer in [1, 100000], got -3"},
      {{"data.synth.size=8"}, "job.yaml: data.synth.size: expected an integer in [16, 512], got 8"},
      {{"data.synth.format=png"},
       "job.yaml: data.synth.format: expected one of dicom, nifti, npy, got \"png\""},
      {{"data.synth.compress=rle"},
       "job.yaml: data.synth.compress: expected none unless format is dicom, got \"rle\" with format nifti"},
      {{"data.synth.format=dicom", "data.synth.compress=zip"},
       "job.yaml: data.synth.compress: expected one of none, rle, jpeg-ls, jpeg-lossless"},
      {{"data.synth.casez=3"},
       "job.yaml: data.synth.casez: unknown option; expected cases, size, format, compress, seed"},
      {{"data.synth=5"}, "job.yaml: data.synth: expected a mapping, got 5"},
      // model (unet, plain_unet, res_enc_unet, sam)
      {{"model.channelz=4"},
       "job.yaml: model.channelz: unknown option; expected name, spatial_dims, in_channels, "
       "out_channels, channels, strides"},
      {{"model.name=resnet"},
       "job.yaml: model.name: expected one of unet, plain_unet, res_enc_unet, sam, got \"resnet\""},
      {{"model={channels: [4, 8]}"},
       "job.yaml: model.name: expected a model name (unet, plain_unet, res_enc_unet, sam)"},
      {{"model.channels=[4, 0, 8]"},
       "job.yaml: model.channels: expected a list of integers >= 1, got [4, 0, 8]"},
      {{"model.strides=[2]"}, "job.yaml: model.strides: expected 2 entries (len(channels) - 1), got "},
      {{"model.kernel_size=4"}, "job.yaml: model.kernel_size: expected an odd number >= 1, got 4"},
      {{"model.norm=group"}, "job.yaml: model.norm: expected one of batch, instance, none, got \"group\""},
      {{"model.dropout=1"}, "job.yaml: model.dropout: expected a number in [0, 1), got 1"},
      {{"model.weights_strict=maybe"},
       "job.yaml: model.weights_strict: expected true or false, got \"maybe\""},
      {{"model={name: plain_unet, n_stages: 1}"},
       "job.yaml: model.n_stages: expected an integer >= 2, got 1"},
      {{"model={name: plain_unet, channels: [4, 8]}"},
       "job.yaml: model.channels: unknown option; expected name, spatial_dims, in_channels, out_channels, "
       "n_stages"},
      {{"model={name: sam, spatial_dims: 3}"},
       "job.yaml: model.spatial_dims: expected 2 (sam is a 2D model), got 3"},
      {{"model={name: sam, preset: huge}"},
       "job.yaml: model.preset: expected one of tiny, small, vit_b, got \"huge\""},
      {{"model={name: sam, num_heads: 3}"},
       "job.yaml: model.embed_dim: expected a positive multiple of num_heads 3"},
      // loss
      {{"loss.name=nope"},
       "job.yaml: loss.name: expected one of dice, ce, bce, dice_ce, dice_bce, focal, "
       "dice_focal, got \"nope\""},
      {{"loss.smoth_nr=1"},
       "job.yaml: loss.smoth_nr: unknown option; expected name, softmax, sigmoid, "
       "include_background"},
      {{"loss.smooth_dr=0"}, "job.yaml: loss.smooth_dr: expected a positive number, got 0"},
      {{"loss.sigmoid=true"},
       "job.yaml: loss.sigmoid: expected at most one of softmax and sigmoid true, got both"},
      {{"loss.alpha=2"}, "job.yaml: loss.alpha: expected a number in [0, 1] or null, got 2"},
      {{"loss.ce_weight=[1, -1]"},
       "job.yaml: loss.ce_weight: expected a list of non-negative numbers, got [1, -1]"},
      // optimizer
      {{"optimizer.lrr=0.1"},
       "job.yaml: optimizer.lrr: unknown option; expected name, lr, momentum, nesterov, "
       "weight_decay, betas, eps"},
      {{"optimizer.lr=0"}, "job.yaml: optimizer.lr: expected a positive number, got 0"},
      {{"optimizer.name=lamb"}, "job.yaml: optimizer.name: expected one of sgd, adam, adamw, got \"lamb\""},
      {{"optimizer.betas=[0.9]"}, "job.yaml: optimizer.betas: expected 2 numbers in [0, 1), got [0.9]"},
      {{"optimizer={name: sgd, lr: 0.1, momentum: 0, nesterov: true}"},
       "job.yaml: optimizer.momentum: expected > 0 with nesterov"},
      // schedule
      {{"schedule.name=sometimes"},
       "job.yaml: schedule.name: expected one of constant, poly, cosine, got \"sometimes\""},
      {{"schedule.warmup_steps=-1"},
       "job.yaml: schedule.warmup_steps: expected a non-negative integer, got -1"},
      {{"schedule.poly_exponent=0"}, "job.yaml: schedule.poly_exponent: expected a positive number, got 0"},
      // train
      {{"train.bogus=1"}, "job.yaml: train.bogus: unknown key; expected epochs, batch_size, accumulate"},
      {{"train.batch_size=0"}, "job.yaml: train.batch_size: expected an integer >= 1, got 0"},
      {{"train.devices=[tpu]"}, "job.yaml: train.devices: expected a list of cpu, cuda or cuda:N"},
      {{"train.devices=[cuda:1, cuda:1]"}, "job.yaml: train.devices: expected each CUDA device at most once"},
      {{"train.cache_rate=2"}, "job.yaml: train.cache_rate: expected a number in [0, 1], got 2"},
      {{"train.loader=fast"}, "job.yaml: train.loader: expected one of actors, simple, got \"fast\""},
      // validation
      {{"validation.mode=max"},
       "job.yaml: validation.mode: expected one of gaussian, constant, nnunet, got \"max\""},
      {{"validation.roi_size=[0, 16, 16]"},
       "job.yaml: validation.roi_size: expected a list of integers >= 1, got [0, 16, 16]"},
      {{"validation.sw_batch_size=0"}, "job.yaml: validation.sw_batch_size: expected an integer >= 1, got 0"},
      // output
      {{"output.runs=x"}, "job.yaml: output.runs: unknown key; expected runs_dir"},
  };
  const std::string job = base_job();
  REQUIRE_OK(parse_job_config(job, "job.yaml"));
  for (const auto& c : cases) {
    CAPTURE(c.set.front());
    auto r = parse_job_config(job, "job.yaml", c.set);
    REQUIRE_FALSE(r.is_ok());
    CHECK(r.status().code() == segflow::ErrorCode::invalid_config);
    const std::string m = r.status().message();
    CHECK_MESSAGE(m.rfind(c.expect, 0) == 0, m);
    CHECK_MESSAGE(m.find('\n') == std::string::npos, m);  // one line
  }
}

TEST_CASE("validating a job builds its stages, model, loss and optimizer without reading or making data") {
  TempDir dir("job_validate");
  const std::string root = (dir.path() / "never-made").string();
  const std::string job = base_job(root);
  const auto registry = segflow::pipeline::builtin_registry();
  REQUIRE_OK_AND_ASSIGN(auto good, parse_job_config(job, "job.yaml"));
  Status st = validate_job_config(good, registry);
  CHECK_OK(st);
  REQUIRE_OK_AND_ASSIGN(auto sam,
                        parse_job_config(job, "job.yaml",
                                         {"model={name: sam, preset: tiny, img_size: 32, patch_size: 4}",
                                          "loss={name: dice_bce, to_onehot_y: false}"}));
  st = validate_job_config(sam, registry);
  CHECK_OK(st);

  // What reading alone cannot tell: stage options (checked by the stage factories), a missing
  // weights file, fp16 on the CPU, an unknown stage.
  const BadCase cases[] = {
      {{"stages.1.options.spacing=[1.5, 0]"},
       "job.yaml: stages[1].options.spacing: expected 3 positive numbers, got [1.5, 0]"},
      {{"stages.2.options.num_samples=0"},
       "job.yaml: stages[2].options.num_samples: expected an integer in [1, 1024]"},
      {{"stages.1.name=resampel"}, "job.yaml: stages[1].name: unknown stage 'resampel'"},
      {{"stages.1.options.sigma=2"},
       "job.yaml: stages[1].options.sigma: unknown option for stage 'resample'; expected keys, spacing, "
       "mode"},
      {{"model.weights=/nonexistent/w.sfta"},
       "job.yaml: model.weights: expected a tensor archive, got \"/nonexistent/w.sfta\" (no such file)"},
      {{"train.amp=fp16"}, "job.yaml: train.amp: fp16 needs a CUDA device"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.set.front());
    REQUIRE_OK_AND_ASSIGN(auto r, parse_job_config(job, "job.yaml", c.set));
    st = validate_job_config(r, registry);
    REQUIRE_FALSE(st.is_ok());
    CHECK_MESSAGE(st.message().rfind(c.expect, 0) == 0, st.message());
    CHECK_MESSAGE(st.message().find('\n') == std::string::npos, st.message());
  }
  CHECK_FALSE(std::filesystem::exists(root));
  CHECK_FALSE(std::filesystem::exists("/nonexistent/segflow-job-config-runs"));
}

TEST_CASE("the resolved job config holds every default and reads back to itself") {
  REQUIRE_OK_AND_ASSIGN(auto c, parse_job_config("stages: [load]\nmodel: {name: unet}\n", "min.yaml"));
  const json& r = c.resolved;
  // Typed values and their resolved JSON agree, defaults included.
  CHECK(c.model.name() == "unet");
  CHECK(c.model.get<UNetOptions>().channels == std::vector<std::int64_t>{16, 32, 64, 128, 256});
  CHECK(r["model"]["channels"] == json({16, 32, 64, 128, 256}));
  CHECK(r["model"]["norm"] == "instance");
  CHECK(r["model"]["weights_strict"] == true);
  CHECK(r["loss"]["name"] == "dice_ce");
  CHECK(r["loss"]["softmax"] == true);
  CHECK(r["loss"]["smooth_dr"] == 1e-5);
  CHECK(r["loss"]["alpha"].is_null());
  CHECK(r["optimizer"]["name"] == "adamw");
  CHECK(r["optimizer"]["lr"] == 1e-3);
  CHECK(r["optimizer"]["betas"] == json({0.9, 0.999}));
  CHECK(r["schedule"]["name"] == "constant");  // no schedule section: constant
  CHECK(r["schedule"]["warmup_steps"] == 0);
  CHECK(r["data"]["synth"].is_null());
  CHECK(r["data"]["val_cases"] == -1);
  CHECK(r["train"]["epochs"] == 10);
  CHECK(r["train"]["cache_bytes"] == (8LL << 30));
  CHECK(r["validation"]["mode"] == "gaussian");
  CHECK(r["output"]["runs_dir"] == "runs");

  // A section without a name keeps parse_schedule_options' default (poly); a synth section
  // gets its defaults; the loss name brings its activation.
  REQUIRE_OK_AND_ASSIGN(
      auto d,
      parse_job_config("stages: [load]\nmodel: {name: sam, preset: tiny}\nschedule: {warmup_steps: 5}\n"
                       "data: {synth: {cases: 3}}\nloss: {name: dice_bce}\n",
                       "min.yaml"));
  CHECK(d.schedule.kind == ScheduleKind::poly);
  CHECK(d.resolved["schedule"]["name"] == "poly");
  REQUIRE(d.data.synth.has_value());
  CHECK(d.data.synth->cases == 3);
  CHECK(d.data.synth->size == 96);
  CHECK(d.resolved["data"]["synth"] == json({{"cases", 3},
                                             {"size", 96},
                                             {"format", "nifti"},
                                             {"compress", "none"},
                                             {"seed", 0},
                                             {"difficulty", "normal"}}));
  CHECK(d.loss.dice.act == LossActivation::sigmoid);
  CHECK(d.resolved["loss"]["sigmoid"] == true);
  CHECK(d.resolved["loss"]["softmax"] == false);
  CHECK(d.resolved["model"]["img_size"] == 64);  // the tiny preset's
  CHECK(d.resolved["model"]["depth"] == 2);

  // What a run folder's config.json and a checkpoint hold reads back to the same config.
  for (const JobConfig* cfg : {&c, &d}) {
    REQUIRE_OK_AND_ASSIGN(auto back, job_config_from_json(cfg->resolved, "ckpt.pt (config)"));
    CHECK(back.resolved == cfg->resolved);
    CHECK(run_name(back) == run_name(*cfg));
  }
}

TEST_CASE("the config of a checkpoint written before typed sections still loads") {
  // What older segflow wrote as the resolved config: sections as given, data.synth null,
  // val_cases -1 for a val_fraction split, train.devices [].
  const json old = json::parse(R"({
    "name": "spleen", "seed": 0,
    "data": {"root": "data/phantoms", "synth": null, "val_fraction": 0.2, "val_cases": -1, "num_classes": 5},
    "stages": [{"name": "load", "options": {}}],
    "model": {"name": "unet", "spatial_dims": 3, "in_channels": 1, "out_channels": 5,
              "channels": [8, 16, 32], "strides": [2, 2], "num_res_units": 1, "norm": "batch"},
    "loss": {"name": "dice_ce", "to_onehot_y": true, "softmax": true},
    "optimizer": {"name": "sgd", "lr": 0.2, "momentum": 0.9, "weight_decay": 4e-05},
    "schedule": {"name": "constant"},
    "train": {"epochs": 300, "batch_size": 4, "accumulate": 1, "grad_clip": 0.0, "amp": "bf16",
              "device": "auto", "devices": [], "val_interval": 10, "checkpoint_interval": 10,
              "steps_per_epoch": 0, "loader": "actors", "decode_workers": 4, "prefetch": 2,
              "cache_rate": 1.0, "cache_bytes": 8589934592, "disk_cache": "", "threads": 0,
              "cudnn_benchmark": true, "channels_last": false, "log_every": 10},
    "validation": {"roi_size": [], "overlap": 0.25, "mode": "gaussian", "sw_batch_size": 1},
    "output": {"runs_dir": "runs"}})");
  REQUIRE_OK_AND_ASSIGN(auto c, job_config_from_json(old, "last.pt (config)"));
  CHECK_FALSE(c.data.synth.has_value());
  CHECK(c.data.val_cases == -1);
  CHECK(c.optimizer.name == "sgd");
  CHECK(c.optimizer.lr == 0.2);
  CHECK(c.optimizer.momentum == 0.9);
  CHECK(c.schedule.kind == ScheduleKind::constant);
  CHECK(c.loss.kind == LossKind::dice_ce);
  CHECK(c.model.get<UNetOptions>().norm == NormKind::batch);
  CHECK(c.model.get<UNetOptions>().channels == std::vector<std::int64_t>{8, 16, 32});
  CHECK(c.train.amp == "bf16");
  CHECK(c.resolved["optimizer"]["betas"] == json({0.9, 0.999}));  // now filled in

  auto bad = job_config_from_json(json{{"stages", {"load"}}, {"model", {{"name", "unet"}, {"chanels", 3}}}},
                                  "x.pt (config)");
  REQUIRE_FALSE(bad.is_ok());
  CHECK(bad.status().message().rfind("x.pt (config): model.chanels: unknown option", 0) == 0);
}

TEST_CASE("the tests' job builder writes the tiny job as a valid config and leaves out emptied sections") {
  JobYaml job;
  job.root = "/nonexistent/segflow-job-builder-data";
  REQUIRE_OK_AND_ASSIGN(auto tiny, parse_job_config(job.yaml(), "job.yaml"));
  CHECK(tiny.name == "tiny");
  CHECK(tiny.seed == 3);
  CHECK(tiny.data.root == "/nonexistent/segflow-job-builder-data");
  REQUIRE(tiny.data.synth.has_value());
  CHECK(tiny.data.synth->size == 24);
  CHECK(tiny.data.val_cases == 1);
  CHECK(tiny.data.num_classes == 5);
  REQUIRE(tiny.stages.stages.size() == 6);
  CHECK(tiny.stages.stages[1].name == "resample");
  CHECK(tiny.stages.stages[5].name == "rand_flip");
  CHECK(tiny.train.epochs == 4);
  CHECK(tiny.resolved["model"]["channels"] == json({4, 8, 16}));

  // Emptied fields are not written at all, so the parser's defaults apply.
  job.seed = job.schedule = job.validation = "";
  job.epochs = -1;
  job.stages = {"load"};
  const std::string text = job.yaml();
  CHECK(text.rfind("name: tiny\ndata:\n", 0) == 0);  // no seed line between them
  CHECK(text.find("schedule:") == std::string::npos);
  CHECK(text.find("validation:") == std::string::npos);
  CHECK(text.find("epochs") == std::string::npos);
  CHECK(text.find("stages:\n  - load\nmodel:") != std::string::npos);
  REQUIRE_OK_AND_ASSIGN(auto plain, parse_job_config(text, "job.yaml"));
  CHECK(plain.seed == JobConfig{}.seed);
  CHECK(plain.train.epochs == JobConfig{}.train.epochs);
}
