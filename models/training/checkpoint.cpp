#include "models/training/checkpoint.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "messages/file_util.hpp"
#include "models/nets/weights.hpp"
#include "models/training/detail/trainer_impl.hpp"

namespace segflow::models {

namespace fs = std::filesystem;
using detail::BindDevice;
using detail::first_line;
using nlohmann::json;

namespace {

constexpr const char* kFormat = "segflow-checkpoint-2";
constexpr const char* kFormat1 = "segflow-checkpoint-1";

std::string tensor_to_string(const at::Tensor& t) {
  at::Tensor c = t.contiguous().to(torch::kCPU);
  return std::string(static_cast<const char*>(c.data_ptr()), static_cast<std::size_t>(c.numel()));
}

at::Tensor string_to_tensor(const std::string& s) {
  return torch::from_blob(const_cast<char*>(s.data()), {static_cast<std::int64_t>(s.size())}, torch::kUInt8)
      .clone();
}

Result<json> read_meta(torch::serialize::InputArchive& root, const fs::path& path) {
  at::Tensor meta_t;
  if (!root.try_read("meta", meta_t))
    return corrupt_data(path.string() + ": not a segflow checkpoint (no 'meta' record)");
  try {
    json meta = json::parse(tensor_to_string(meta_t));
    const std::string format = meta.value("format", "nothing");
    if (format != kFormat1 && format != kFormat)
      return corrupt_data(path.string() + ": meta.format: expected " + kFormat + " (or -1), got " + format);
    return meta;
  } catch (const std::exception& e) {
    return corrupt_data(path.string() + ": meta: invalid JSON: " + e.what());
  }
}

/// The archive with every tensor on the CPU, whatever device it was saved from (LibTorch's
/// map_location): the caller copies them where they belong.
Result<torch::serialize::InputArchive> open_archive(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return not_found(path.string() + ": no such checkpoint");
  try {
    torch::serialize::InputArchive root;
    root.load_from(path.string(), c10::Device(c10::kCPU));
    return root;
  } catch (const std::exception& e) {
    return corrupt_data(path.string() + ": unreadable checkpoint: " + first_line(e));
  }
}

/// The optimizer's state from "optimizer_state", or from a format-1 "optimizer" record
/// (torch::optim's own serialisation: read by the same torch::optim kind over the same
/// parameters, then converted; the state tensors are still on the CPU here).
Status restore_optimizer(torch::serialize::InputArchive& root, const json& meta, FusedOptimizer& opt,
                         const std::vector<at::Tensor>& params, const fs::path& path) {
  torch::serialize::InputArchive opt_ar;
  if (root.try_read("optimizer_state", opt_ar)) {
    TensorMap state;
    for (const auto& [name, t] : opt.state()) {
      at::Tensor v;
      if (opt_ar.try_read(name, v)) state.emplace(name, v);
    }
    if (Status st = opt.load_state(state); !st.is_ok())
      return corrupt_data(path.string() + ": " + st.message() +
                          " (optimizer: " + meta.value("optimizer", "?") + " in the checkpoint, " +
                          opt.options().name + " in the config)");
    return Status::ok();
  }
  if (root.try_read("optimizer", opt_ar)) {
    auto reference = make_optimizer(opt.options(), params);
    if (!reference.is_ok()) return reference.status().with_context(path.string());
    (*reference)->load(opt_ar);
    if (Status st = opt.load_torch_state(**reference); !st.is_ok())
      return corrupt_data(path.string() + ": optimizer (format 1): " + st.message());
    return Status::ok();
  }
  return corrupt_data(path.string() + ": no 'optimizer_state' record");
}

/// The generators' states: the CPU's always, the CUDA one's when loading on CUDA.
void restore_rng(torch::serialize::InputArchive& root, const c10::Device& device) {
  at::Tensor rng;
  if (root.try_read("rng_cpu", rng)) {
    at::Generator cpu_gen = at::detail::getDefaultCPUGenerator();
    cpu_gen.set_state(rng.to(at::kCPU));
  }
  if (device.is_cuda() && root.try_read("rng_cuda", rng)) {
    at::Generator cuda_gen = at::globalContext().defaultGenerator(device);
    cuda_gen.set_state(rng.to(at::kCPU));
  }
}

}  // namespace

Status Trainer::save_checkpoint(const fs::path& path) const {
  try {
    BindDevice bind(device_);
    torch::serialize::OutputArchive root;
    torch::serialize::OutputArchive model_ar, opt_ar;
    model_.module().save(model_ar);
    for (const auto& [name, t] : impl_->optimizer->state()) opt_ar.write(name, t);
    root.write("model", model_ar);
    root.write("optimizer_state", opt_ar);
    const auto& scaler = *impl_->scaler;
    json meta = {{"format", kFormat},
                 {"epoch", state_.epoch},
                 {"step", state_.step},
                 {"best_metric", state_.best_metric},
                 {"best_epoch", state_.best_epoch},
                 {"optimizer", impl_->optimizer->options().name},
                 {"loss_scale", scaler.scale_value()},
                 {"good_steps", scaler.growth_tracker_value()},
                 {"skipped_steps", scaler.skipped_value()},
                 {"num_classes", num_classes_},
                 {"saved_on", device_.str()},
                 {"early_stop", early_stop_state_json(state_.early_stop)},
                 {"config", cfg_.resolved}};
    // The model carries its classes: inference never looks for the training data.
    if (!class_names_.empty()) meta["class_names"] = class_names_;
    root.write("meta", string_to_tensor(meta.dump()));
    root.write("rng_cpu", at::detail::getDefaultCPUGenerator().get_state());
    if (device_.is_cuda()) {
      auto& gen = at::globalContext().defaultGenerator(device_);
      root.write("rng_cuda", gen.get_state());
    }
    std::error_code ec;
    fs::create_directories(path.parent_path(), ec);
    return replace_file_atomically(path, [&](const fs::path& tmp) {
      root.save_to(tmp.string());
      return Status::ok();
    });
  } catch (const std::exception& e) {
    return io_error(path.string() + ": writing the checkpoint failed: " + first_line(e));
  }
}

Status Trainer::load_checkpoint(const fs::path& path) {
  SEGFLOW_ASSIGN_OR_RETURN(auto root, open_archive(path));
  SEGFLOW_ASSIGN_OR_RETURN(json meta, read_meta(root, path));
  try {
    BindDevice bind(device_);
    torch::serialize::InputArchive model_ar;
    if (!root.try_read("model", model_ar)) return corrupt_data(path.string() + ": no 'model' record");
    const TensorMap weights = read_module_archive(model_ar, model_.module());
    if (Status st = load_into(model_.module(), weights, /*strict=*/true); !st.is_ok())
      return corrupt_data(path.string() + ": model: checkpoint does not fit this model: " + st.message());
    SEGFLOW_RETURN_IF_ERROR(restore_optimizer(root, meta, *impl_->optimizer, impl_->params, path));
    restore_rng(root, device_);
    if (meta.contains("class_names")) {
      const json& names = meta["class_names"];
      if (!names.is_array() ||
          std::any_of(names.begin(), names.end(), [](const json& n) { return !n.is_string(); }))
        return corrupt_data(path.string() + ": meta.class_names: expected an array of strings, got " +
                            names.dump());
      class_names_ = names.get<std::vector<std::string>>();
    }
    state_.epoch = meta.at("epoch").get<std::int64_t>();
    state_.step = meta.at("step").get<std::int64_t>();
    state_.best_metric = meta.at("best_metric").get<double>();
    state_.best_epoch = meta.at("best_epoch").get<std::int64_t>();
    state_.good_steps = meta.at("good_steps").get<std::int64_t>();
    state_.skipped_steps = meta.value("skipped_steps", std::int64_t{0});
    // Absent in checkpoints written before early stopping: a fresh count.
    state_.early_stop = early_stop_state_from_json(meta.value("early_stop", json(nullptr)));
    // A scale from a run in another precision means nothing here: only fp16 keeps one.
    state_.loss_scale = impl_->scaler->options().enabled ? meta.at("loss_scale").get<double>() : 1.0;
    if (!impl_->scaler->options().enabled) state_.good_steps = 0;
    impl_->scaler->load(state_.loss_scale, state_.good_steps, state_.skipped_steps);
    impl_->last_scale = state_.loss_scale;
    return Status::ok();
  } catch (const std::exception& e) {
    return corrupt_data(path.string() + ": checkpoint does not fit this model/optimizer: " + first_line(e));
  }
}

Result<json> read_checkpoint_meta(const fs::path& checkpoint) {
  SEGFLOW_ASSIGN_OR_RETURN(auto root, open_archive(checkpoint));
  return read_meta(root, checkpoint);
}

Result<std::unique_ptr<Trainer>> load_for_inference(const fs::path& checkpoint, const std::string& device,
                                                    bool channels_last) {
  SEGFLOW_ASSIGN_OR_RETURN(auto root, open_archive(checkpoint));
  SEGFLOW_ASSIGN_OR_RETURN(json meta, read_meta(root, checkpoint));
  SEGFLOW_ASSIGN_OR_RETURN(JobConfig cfg,
                           job_config_from_json(meta.at("config"), checkpoint.string() + " (config)"));
  cfg.model.weights.clear();  // the checkpoint holds the weights
  SEGFLOW_ASSIGN_OR_RETURN(c10::Device dev, resolve_device(device));
  if (cfg.train.amp == "fp16" && !dev.is_cuda()) cfg.train.amp = "none";
  cfg.train.channels_last = channels_last;
  SEGFLOW_ASSIGN_OR_RETURN(auto t, Trainer::create(cfg, dev));
  SEGFLOW_RETURN_IF_ERROR(t->load_checkpoint(checkpoint));
  return t;
}

}  // namespace segflow::models
