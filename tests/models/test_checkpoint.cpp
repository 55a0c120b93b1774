// Checkpoints across devices: a checkpoint is read onto the CPU and copied into the trainer's
// own tensors, whatever device wrote it; format-1 checkpoints (torch::optim state) still load;
// a checkpoint that does not fit is refused naming the file and the part. (The CUDA round
// trip is in test_cuda.cpp; it needs a GPU.)
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "job_yaml.hpp"
#include "models/training/job_config.hpp"
#include "models/training/optim.hpp"
#include "models/training/trainer.hpp"
#include "pipeline/staged_source.hpp"
#include "test_util.hpp"

using namespace segflow;
using namespace segflow::models;
using segflow::testing::TempDir;

namespace {

JobConfig unet_job(const std::string& optimizer, const std::string& extra_train = "",
                   const std::string& channels = "[4, 8]") {
  testing::JobYaml job;
  job.name = "ckpt";
  job.seed = "2";
  job.stages = {"load"};
  job.model = testing::unet3d(3, "channels: " + channels + ", strides: [2], num_res_units: 1, norm: batch");
  job.optimizer = optimizer;
  job.epochs = 3;
  job.train = "batch_size: 2, device: cpu, threads: 2" + extra_train;
  job.validation = "";
  REQUIRE_OK_AND_ASSIGN(auto c, parse_job_config(job.yaml(), "ckpt.yaml"));
  return c;
}

Batch batch() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(8);
  at::Tensor label = at::randint(0, 3, {2, 1, 8, 8, 8}, gen, at::TensorOptions().dtype(at::kLong));
  Batch b;
  b.ids = {"a", "b"};
  b.tensors["image"] = label.to(at::kFloat) + 0.2 * at::randn({2, 1, 8, 8, 8}, gen, at::TensorOptions());
  b.tensors["label"] = label;
  return b;
}

void train(Trainer& t, std::int64_t steps) {
  pipeline::StagedBatchSource src({batch()}, steps);
  TrainObserver none;
  REQUIRE_OK(t.train_epoch(src, steps, none));
}

std::vector<at::Tensor> model_tensors(Trainer& t) {
  std::vector<at::Tensor> out;
  for (const auto& p : t.model().module().parameters()) out.push_back(p);
  for (const auto& b : t.model().module().buffers()) out.push_back(b);
  return out;
}

}  // namespace

TEST_CASE("a checkpoint loads into the trainer's own tensors: values, device, layout and identity kept") {
  TempDir dir("ckpt");
  for (const char* opt : {"{name: sgd, lr: 0.1, momentum: 0.9}", "{name: adamw, lr: 0.01}"}) {
    CAPTURE(opt);
    auto cfg = unet_job(opt, ", channels_last: true");
    REQUIRE_OK_AND_ASSIGN(auto a, Trainer::create(cfg, c10::Device(c10::kCPU)));
    train(*a, 3);
    a->scaler().load(1.0, 0, 2);  // a run that skipped two steps
    REQUIRE_OK(a->save_checkpoint(dir / "a.pt"));

    REQUIRE_OK_AND_ASSIGN(auto b, Trainer::create(cfg, c10::Device(c10::kCPU)));
    std::vector<const void*> impls;
    for (const auto& t : model_tensors(*b)) impls.push_back(t.unsafeGetTensorImpl());
    const TensorMap fresh_state = b->optimizer().state();
    REQUIRE_OK(b->load_checkpoint(dir / "a.pt"));

    const auto ta = model_tensors(*a), tb = model_tensors(*b);
    REQUIRE(ta.size() == tb.size());
    for (std::size_t i = 0; i < ta.size(); ++i) {
      CAPTURE(i);
      CHECK(torch::equal(ta[i], tb[i]));
      CHECK((tb[i].device() == b->device()));
      CHECK(tb[i].unsafeGetTensorImpl() == impls[i]);  // copied into, not replaced
      CHECK((tb[i].strides() == ta[i].strides()));     // channels-last weights stay so
    }
    bool any_channels_last = false;
    for (const auto& p : b->parameters())
      any_channels_last |=
          p.dim() == 5 && p.is_contiguous(at::MemoryFormat::ChannelsLast3d) && !p.is_contiguous();
    CHECK(any_channels_last);
    // The optimizer still updates the model's own parameters.
    for (std::size_t i = 0; i < b->parameters().size(); ++i)
      CHECK(b->optimizer().parameters()[i].unsafeGetTensorImpl() == b->parameters()[i].unsafeGetTensorImpl());
    const TensorMap sa = a->optimizer().state(), sb = b->optimizer().state();
    REQUIRE(sa.size() == sb.size());
    for (const auto& [k, v] : sb) {
      const auto& key = k;  // clang 14 cannot capture a structured binding
      CAPTURE(key);
      CHECK(torch::equal(v, sa.at(k)));
      CHECK((v.device() == b->device()));
      CHECK(v.unsafeGetTensorImpl() == fresh_state.at(k).unsafeGetTensorImpl());
    }
    CHECK(b->scaler().skipped_value() == 2);
    CHECK(b->state().skipped_steps == 2);
    CHECK(b->state().step == 3);
    // And the two go on identically.
    train(*a, 2);
    train(*b, 2);
    const auto ua = model_tensors(*a), ub = model_tensors(*b);
    for (std::size_t i = 0; i < ua.size(); ++i) CHECK(torch::equal(ua[i], ub[i]));
  }
}

TEST_CASE("the checkpoint's tensors are read onto the CPU whatever device they name") {
  // load_checkpoint maps every tensor to the CPU (LibTorch's map_location) and then copies:
  // read the file the same way and check nothing in it is needed on its saved device.
  TempDir dir("ckpt_map");
  auto cfg = unet_job("{name: sgd, lr: 0.1, momentum: 0.9}");
  REQUIRE_OK_AND_ASSIGN(auto a, Trainer::create(cfg, c10::Device(c10::kCPU)));
  train(*a, 1);
  REQUIRE_OK(a->save_checkpoint(dir / "a.pt"));
  torch::serialize::InputArchive root;
  root.load_from((dir / "a.pt").string(), c10::Device(c10::kCPU));
  torch::serialize::InputArchive model_ar, opt_ar;
  REQUIRE(root.try_read("model", model_ar));
  REQUIRE(root.try_read("optimizer_state", opt_ar));
  const TensorMap w = read_module_archive(model_ar, a->model().module());
  CHECK(w.size() == model_tensors(*a).size());
  for (const auto& [k, v] : w) CHECK(v.device().is_cpu());
  at::Tensor m;
  CHECK(opt_ar.try_read("momentum_0", m));
  at::Tensor meta;
  REQUIRE(root.try_read("meta", meta));
  auto j = nlohmann::json::parse(std::string(static_cast<const char*>(meta.data_ptr()), meta.numel()));
  CHECK(j["format"] == "segflow-checkpoint-2");
  CHECK(j["saved_on"] == "cpu");
}

TEST_CASE("a format-1 checkpoint with torch::optim state resumes with its momentum") {
  TempDir dir("ckpt_v1");
  auto cfg = unet_job("{name: sgd, lr: 0.1, momentum: 0.9, impl: reference}");
  REQUIRE_OK_AND_ASSIGN(auto a, Trainer::create(cfg, c10::Device(c10::kCPU)));
  train(*a, 2);
  // Write what segflow wrote before: Module::save, torch::optim's own serialisation, meta 1.
  REQUIRE_OK_AND_ASSIGN(auto torch_opt, make_optimizer(cfg.optimizer, a->parameters()));
  REQUIRE(torch_opt->state().empty());
  // The reference impl's momentum, put into a stand-alone torch::optim::SGD.
  for (std::size_t i = 0; i < a->parameters().size(); ++i) {
    auto st = std::make_unique<torch::optim::SGDParamState>();
    st->momentum_buffer(a->optimizer().state().at("momentum_" + std::to_string(i)).clone());
    torch_opt->state()[a->parameters()[i].unsafeGetTensorImpl()] = std::move(st);
  }
  torch::serialize::OutputArchive root, model_ar, opt_ar;
  a->model().module().save(model_ar);
  torch_opt->save(opt_ar);
  root.write("model", model_ar);
  root.write("optimizer", opt_ar);
  nlohmann::json meta = {{"format", "segflow-checkpoint-1"},
                         {"epoch", 1},
                         {"step", 2},
                         {"best_metric", -1.0},
                         {"best_epoch", -1},
                         {"loss_scale", 65536.0},
                         {"good_steps", 0},
                         {"config", cfg.resolved}};
  const std::string text = meta.dump();
  root.write("meta", torch::from_blob(const_cast<char*>(text.data()),
                                      {static_cast<std::int64_t>(text.size())}, torch::kUInt8)
                         .clone());
  root.save_to((dir / "v1.pt").string());

  auto fused_cfg = unet_job("{name: sgd, lr: 0.1, momentum: 0.9}");
  REQUIRE_OK_AND_ASSIGN(auto b, Trainer::create(fused_cfg, c10::Device(c10::kCPU)));
  REQUIRE_OK(b->load_checkpoint(dir / "v1.pt"));
  const TensorMap sa = a->optimizer().state(), sb = b->optimizer().state();
  for (const auto& [k, v] : sa) {
    const auto& key = k;  // clang 14 cannot capture a structured binding
    CAPTURE(key);
    CHECK(torch::equal(v, sb.at(k)));
  }
  CHECK(b->state().step == 2);
  CHECK(b->state().skipped_steps == 0);
  // Resumed on the fused impl, it continues as the reference run does (same math, 1e-6).
  train(*a, 2);
  train(*b, 2);
  const auto ua = model_tensors(*a), ub = model_tensors(*b);
  for (std::size_t i = 0; i < ua.size(); ++i)
    CHECK(((ua[i].to(at::kDouble) - ub[i].to(at::kDouble)).abs().max().item<double>()) < 1e-5);
}

TEST_CASE("a checkpoint of another model or optimizer is refused naming the file and the part") {
  TempDir dir("ckpt_bad");
  REQUIRE_OK_AND_ASSIGN(
      auto small, Trainer::create(unet_job("{name: sgd, lr: 0.1, momentum: 0.9}"), c10::Device(c10::kCPU)));
  REQUIRE_OK(small->save_checkpoint(dir / "small.pt"));
  auto wide =
      Trainer::create(unet_job("{name: sgd, lr: 0.1, momentum: 0.9}", "", "[6, 8]"), c10::Device(c10::kCPU));
  REQUIRE_OK(wide);
  const auto before = model_tensors(**wide)[0].clone();
  auto st = (*wide)->load_checkpoint(dir / "small.pt");
  REQUIRE_FALSE(st.is_ok());
  CHECK(st.message().find((dir / "small.pt").string()) != std::string::npos);
  CHECK(st.message().find("model") != std::string::npos);
  CHECK(st.message().find("shape mismatch") != std::string::npos);
  CHECK(torch::equal(model_tensors(**wide)[0], before));  // nothing copied

  REQUIRE_OK_AND_ASSIGN(auto adam,
                        Trainer::create(unet_job("{name: adam, lr: 0.01}"), c10::Device(c10::kCPU)));
  st = adam->load_checkpoint(dir / "small.pt");
  REQUIRE_FALSE(st.is_ok());
  CHECK(st.message().find((dir / "small.pt").string()) != std::string::npos);
  CHECK(st.message().find("optimizer") != std::string::npos);
  CHECK(st.message().find("sgd in the checkpoint, adam in the config") != std::string::npos);
}

TEST_CASE("a job config naming one GPU twice in train.devices is refused when it is read") {
  const std::string base = "name: d\nstages: [load]\nmodel: {name: unet}\ntrain: {devices: ";
  for (const char* bad : {"[cuda:0, cuda:0]", "[cuda, cuda:0]", "[cuda:1, cuda:0, cuda:1]"}) {
    CAPTURE(bad);
    auto c = parse_job_config(base + bad + "}\n", "dp.yaml");
    REQUIRE_FALSE(c.is_ok());
    CHECK(c.status().message().find("dp.yaml: train.devices: expected each CUDA device at most once") !=
          std::string::npos);
  }
  for (const char* good : {"[cuda:0, cuda:1]", "[cpu, cpu]", "[]"}) {
    CAPTURE(good);
    auto c = parse_job_config(base + good + "}\n", "dp.yaml");
    CHECK_OK(c);
  }
}

TEST_CASE("SAM and PlainConvUNet checkpoints, nested module trees, round-trip into fresh trainers") {
  TempDir dir("ckpt_models");
  const std::vector<std::pair<std::string, std::string>> models = {
      {"{name: sam, preset: tiny, img_size: 32, patch_size: 4, embed_dim: 32, spatial_dims: 2, in_channels: "
       "3, "
       "out_channels: 1}",
       "{name: dice_bce, sigmoid: true, to_onehot_y: false}"},
      {"{name: plain_unet, spatial_dims: 3, in_channels: 1, out_channels: 3, n_stages: 3, base_features: 4, "
       "deep_supervision: true}",
       "{name: dice_ce, to_onehot_y: true, softmax: true}"}};
  for (const auto& [model, loss] : models) {
    const auto& model_name = model;  // clang 14 cannot capture a structured binding
    CAPTURE(model_name);
    testing::JobYaml job;
    job.name = "m";
    job.seed = "4";
    job.stages = {"load"};
    job.model = model;
    job.loss = loss;
    job.optimizer = "{name: adamw, lr: 0.01}";
    job.schedule = job.validation = "";
    job.epochs = -1;
    job.train = "device: cpu";
    REQUIRE_OK_AND_ASSIGN(auto cfg, parse_job_config(job.yaml(), "m.yaml"));
    REQUIRE_OK_AND_ASSIGN(auto a, Trainer::create(cfg, c10::Device(c10::kCPU)));
    // Perturb every tensor so that a fresh trainer (same seed) differs everywhere.
    {
      torch::NoGradGuard ng;
      for (auto& t : model_tensors(*a))
        if (t.is_floating_point()) t.add_(0.5);
      for (const auto& [k, v] : a->optimizer().state()) v.add_(0.25);
    }
    REQUIRE_OK(a->save_checkpoint(dir / "m.pt"));
    cfg.seed = 5;
    REQUIRE_OK_AND_ASSIGN(auto b, Trainer::create(cfg, c10::Device(c10::kCPU)));
    REQUIRE_OK(b->load_checkpoint(dir / "m.pt"));
    const auto ta = model_tensors(*a), tb = model_tensors(*b);
    REQUIRE(ta.size() == tb.size());
    for (std::size_t i = 0; i < ta.size(); ++i) CHECK(torch::equal(ta[i], tb[i]));
    const TensorMap sa = a->optimizer().state(), sb = b->optimizer().state();
    for (const auto& [k, v] : sa) CHECK(torch::equal(v, sb.at(k)));
  }
}
