#include "models/training/trainer.hpp"

#include <ATen/autocast_mode.h>
#include <ATen/ops/_foreach_mul.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "messages/file_util.hpp"
#include "messages/log.hpp"
#include "models/nets/recompute.hpp"
#include "models/training/checkpoint.hpp"
#include "models/training/detail/trainer_impl.hpp"
#include "models/training/losses.hpp"
#include "models/training/metrics.hpp"
#include "models/training/optim.hpp"
#include "models/training/run_layout.hpp"
#include "models/training/sliding_window.hpp"

namespace segflow::models {

namespace fs = std::filesystem;
using detail::BindDevice;
using detail::first_line;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// Memory format of a model's activations and conv weights when train.channels_last is set.
at::MemoryFormat channels_last_format(std::int64_t spatial_dims) {
  return spatial_dims == 3 ? at::MemoryFormat::ChannelsLast3d : at::MemoryFormat::ChannelsLast;
}

}  // namespace

Result<c10::Device> resolve_device(const std::string& text) {
  if (text == "auto")
    return torch::cuda::is_available() ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  if (text == "cpu") return c10::Device(c10::kCPU);
  if (text.rfind("cuda", 0) == 0) {
    if (!torch::cuda::is_available())
      return invalid_argument("device " + text + ": CUDA is not available on this machine (use cpu or auto)");
    try {
      c10::Device d(text);
      if (d.has_index() && d.index() >= static_cast<int>(torch::cuda::device_count()))
        return invalid_argument("device " + text + ": only " + std::to_string(torch::cuda::device_count()) +
                                " CUDA devices");
      return d.has_index() ? d : c10::Device(c10::kCUDA, 0);
    } catch (const std::exception& e) {
      return invalid_argument("device " + text + ": " + e.what());
    }
  }
  return invalid_argument("device: expected auto, cpu, cuda or cuda:N, got \"" + text + "\"");
}

Trainer::Impl::StatsRead Trainer::Impl::read_stats() {
  ++host_reads;
  at::Tensor h = at::cat({loss_sums, scaler->skipped_steps().reshape({1}).to(at::kDouble),
                          scaler->scale_tensor().reshape({1}).to(at::kDouble)})
                     .to(at::kCPU);
  const double* v = h.data_ptr<double>();
  loss_sums.narrow(0, 0, 1).zero_();
  window_steps = 0;
  return StatsRead{v[0], v[1], static_cast<std::int64_t>(v[2]), v[3]};
}

Trainer::Trainer(JobConfig cfg, c10::Device device, ModelHandle model)
    : cfg_(std::move(cfg)), device_(device), model_(std::move(model)), impl_(std::make_unique<Impl>()) {}
Trainer::~Trainer() = default;

const std::vector<at::Tensor>& Trainer::parameters() const { return impl_->params; }
FusedOptimizer& Trainer::optimizer() { return *impl_->optimizer; }
GradScaler& Trainer::scaler() { return *impl_->scaler; }
std::int64_t Trainer::host_reads() const { return impl_->host_reads; }
const IntraOpTeam& Trainer::intra_op_team() const { return *impl_->threads; }
void Trainer::fit_intra_op_team() const { impl_->threads->update(); }

Result<std::unique_ptr<Trainer>> Trainer::create(const JobConfig& cfg, const c10::Device& device) {
  try {
    // train.amp as this device runs it (auto resolved once, here; the checkpoint keeps the
    // setting, so a resumed or inferring job resolves it again for its own device).
    auto amp = resolve_amp(cfg.train.amp, device);
    if (!amp.is_ok()) return amp.status().with_context(cfg.file);
    BindDevice bind(device);
    // The intra-op team first: the model's creation and its first ops run with it.
    auto threads = std::make_unique<IntraOpTeam>(cfg.train.threads);
    torch::manual_seed(cfg.seed);
    if (device.is_cuda()) {
      at::globalContext().setBenchmarkCuDNN(cfg.train.cudnn_benchmark);
      // TF32 for float32 matmuls (cuBLAS) and convolutions (cuDNN's default already).
      at::globalContext().setFloat32MatmulPrecision("high");
      at::globalContext().setAllowTF32CuDNN(true);
    }
    WeightsReport report;
    auto model = create_model(cfg.model, &report);
    if (!model.is_ok()) return model.status().with_context(cfg.file + ": model");
    JobConfig run_cfg = cfg;
    run_cfg.train.amp = amp->mode;
    std::unique_ptr<Trainer> t(new Trainer(std::move(run_cfg), device, *model));
    t->amp_reason_ = amp->reason;
    // Debug here: inference builds trainers too, and its stderr is its report. A training run
    // logs the team at info with its run line (actors/jobs/job_runner.cpp).
    log::debug("intra-op threads " + threads->reason());
    t->impl_->threads = std::move(threads);
    if (cfg.train.amp == "auto")
      log::info("train.amp " + amp->reason + ": " + amp->mode + " on " + device.str());
    t->model_.module().to(device);
    if (cfg.train.channels_last) {
      // Weights of the conv layers (the tensors with spatial dimensions) in channels-last
      // layout, before the optimizer allocates its state like them; inputs follow in
      // model_inputs. Other tensors keep their layout.
      torch::NoGradGuard ng;
      const auto dims = t->model_.info().spatial_dims;
      for (auto& p : t->model_.module().parameters())
        if (p.dim() == dims + 2) p.set_data(p.data().contiguous(channels_last_format(dims)));
    }
    t->num_classes_ = cfg.data.num_classes > 0 ? cfg.data.num_classes
                                               : std::max<std::int64_t>(2, t->model_.info().out_channels);

    auto loss = make_loss(cfg.loss);
    if (!loss.is_ok()) return loss.status().with_context(cfg.file + ": loss");
    if (cfg.loss.iou_weight > 0 && !t->model_.info().iou_output)
      return invalid_config(cfg.file +
                            ": loss.iou_weight: expected a model with an IoU head (sam with "
                            "iou_head: true), got model " +
                            t->model_.info().name + " without one");
    t->impl_->loss = *loss;
    if (t->model_.info().deep_supervision) t->impl_->ds_loss.emplace(*loss, cfg.loss.deep_supervision);

    t->impl_->params = t->model_.trainable_parameters();
    auto opt = FusedOptimizer::create(cfg.optimizer, t->impl_->params);
    if (!opt.is_ok()) return opt.status().with_context(cfg.file + ": optimizer");
    t->impl_->optimizer = std::move(*opt);
    t->impl_->base_lr = cfg.optimizer.lr;
    t->impl_->schedule = std::make_unique<LrSchedule>(cfg.schedule, cfg.optimizer.lr);
    GradScalerOptions go;
    go.enabled = amp->mode == "fp16";
    t->impl_->scaler = std::make_unique<GradScaler>(go, device);
    // Frozen parameters stay in the optimizer (so unfreeze_epoch can train them); without a
    // gradient it leaves them, and their state, alone (train_epoch sets requires_grad).
    auto frozen = frozen_parameters(t->model_.module(), cfg.train.freeze, "train.freeze");
    if (!frozen.is_ok()) return frozen.status().with_context(cfg.file);
    report.frozen = *frozen;
    report.unfreeze_epoch = cfg.train.unfreeze_epoch;
    for (const auto& p : t->model_.module().named_parameters(true))
      if (std::find(frozen->begin(), frozen->end(), p.key()) != frozen->end())
        t->impl_->frozen.push_back(p.value());
    if (!report.path.empty() || !report.frozen.empty()) log::info(report.summary());
    t->impl_->weights_report = std::move(report);
    t->state_.loss_scale = go.enabled ? go.init_scale : 1.0;
    t->impl_->last_scale = t->state_.loss_scale;
    t->impl_->loss_sums = at::zeros({2}, at::TensorOptions().dtype(at::kDouble).device(device));
    return t;
  } catch (const std::exception& e) {
    return internal_error(cfg.file + ": building the trainer: " + first_line(e));
  }
}

namespace {
/// Image and target of a batch on `device`, shaped for the model.
std::pair<at::Tensor, at::Tensor> model_inputs(const Batch& b, const ModelInfo& info,
                                               const c10::Device& device, bool channels_last) {
  at::Tensor image = b.tensors.at("image").to(device, at::kFloat, /*non_blocking=*/true);
  at::Tensor label = b.tensors.at("label").to(device, /*non_blocking=*/true);
  // 2D models take (N, C, 1, H, W) crops of volumes as (N, C, H, W).
  if (info.spatial_dims == 2 && image.dim() == 5 && image.size(2) == 1) {
    image = image.squeeze(2);
    if (label.dim() == 5) label = label.squeeze(2);
  }
  if (channels_last && image.dim() == info.spatial_dims + 2)
    image = image.contiguous(channels_last_format(info.spatial_dims));
  if (!at::isFloatingType(label.scalar_type())) label = label.to(at::kLong);
  return {image, label};
}
}  // namespace

Result<StepInfo> Trainer::train_step(pipeline::BatchSource& source, std::int64_t total_steps,
                                     TrainObserver& observer) {
  try {
    BindDevice bind(device_);
    const auto& tr = cfg_.train;
    const std::int64_t log_every = std::max<std::int64_t>(1, tr.log_every);
    impl_->threads->update();
    model_.module().train();
    auto& opt = *impl_->optimizer;
    auto& scaler = *impl_->scaler;
    const auto t_step = Clock::now();
    StepInfo si;
    si.epoch = state_.epoch;
    std::int64_t micro = 0;
    const double lr = impl_->schedule->lr_at(state_.step, std::max<std::int64_t>(1, total_steps));
    opt.set_lr(lr);
    // Gather up to `accumulate` micro-batches; gradients add up (no step in between).
    at::Tensor step_loss;
    bool synced = false;
    while (micro < tr.accumulate) {
      SEGFLOW_ASSIGN_OR_RETURN(auto batch, source.next());
      si.data_wait_s += source.last_wait_s();
      for (auto& f : source.take_failures()) observer.on_case_failure(f);
      const bool have = sync_ ? sync_->all_have(batch.has_value()) : batch.has_value();
      if (!have) {
        si.data_ended = true;
        break;
      }
      auto [image, label] = model_inputs(*batch, model_.info(), device_, tr.channels_last);
      at::Tensor box;
      if (model_.info().needs_box) box = batch->tensors.at("box").to(device_, at::kFloat);
      std::vector<at::Tensor> outs;
      {
        AutocastGuard ac(device_, tr.amp);
        RecomputeScope recompute(tr.activation_checkpointing);  // models/nets/recompute.hpp
        outs = model_.forward(image, box);
      }
      // The loss in float32, outside autocast.
      for (auto& o : outs) o = o.to(at::kFloat);
      at::Tensor loss = impl_->ds_loss ? (*impl_->ds_loss)(outs, label) : impl_->loss(outs[0], label);
      if (cfg_.loss.iou_weight > 0 && model_.info().iou_output)
        loss = loss + cfg_.loss.iou_weight * iou_prediction_loss(outs[0], outs.at(1), label);
      at::Tensor scaled = scaler.scale(loss);
      if (tr.accumulate > 1) scaled = scaled / static_cast<double>(tr.accumulate);
      if (sync_) {
        const bool last_micro = micro + 1 == tr.accumulate;
        sync_->before_backward(scaled, last_micro);
        synced = synced || last_micro;
      }
      scaled.backward();
      step_loss = step_loss.defined() ? step_loss + loss.detach() : loss.detach();
      si.samples += image.size(0);
      ++micro;
    }
    si.micro_batches = micro;
    if (micro == 0) return si;
    if (sync_) sync_->after_backward(synced);
    std::vector<at::Tensor> grads;
    for (auto& p : impl_->params)
      if (p.grad().defined()) grads.push_back(p.grad());
    // A short last step (epoch ended mid-accumulation) is rescaled to a full mean.
    if (micro < tr.accumulate && !grads.empty()) {
      torch::NoGradGuard ng;
      at::_foreach_mul_(grads, static_cast<double>(tr.accumulate) / static_cast<double>(micro));
    }
    // Unscale (fp16) and look for inf/NaN (every precision), clip, step: all on the device;
    // the optimizer skips the update when found_inf is set.
    const at::Tensor norm = scaler.unscale_(impl_->params);  // defined when bf16/fp32 computed it
    if (tr.grad_clip > 0.0) clip_grad_norm_(impl_->params, tr.grad_clip, norm);
    opt.step(scaler.found_inf());
    scaler.update();
    opt.zero_grad();
    impl_->loss_sums.add_(step_loss / static_cast<double>(micro));
    ++state_.step;
    ++impl_->epoch_steps;
    ++impl_->window_steps;
    si.step = state_.step;
    si.step_in_epoch = impl_->epoch_steps;
    si.lr = lr;
    if (state_.step % log_every == 0) {
      const std::int64_t window_steps = impl_->window_steps;
      const Impl::StatsRead r = impl_->read_stats();
      si.logged = true;
      impl_->last_loss = r.window_loss_sum / static_cast<double>(window_steps);
      impl_->last_scale = r.loss_scale;
      si.skipped_steps = r.skipped_total - state_.skipped_steps;
      state_.skipped_steps = r.skipped_total;
    }
    si.loss = impl_->last_loss;
    si.loss_scale = impl_->last_scale;
    si.skipped = si.skipped_steps > 0;
    si.step_s = seconds_since(t_step);
    observer.on_step(si);
    return si;
  } catch (const std::exception& e) {
    return internal_error("training epoch " + std::to_string(state_.epoch) + ", step " +
                          std::to_string(state_.step + 1) + ": " + first_line(e));
  }
}

Result<EpochInfo> Trainer::train_epoch(pipeline::BatchSource& source, std::int64_t steps_per_epoch,
                                       TrainObserver& observer) {
  try {
    BindDevice bind(device_);
    const auto& tr = cfg_.train;
    const std::int64_t total_steps = std::max<std::int64_t>(1, tr.epochs * steps_per_epoch);
    SEGFLOW_RETURN_IF_ERROR(source.start_epoch(state_.epoch));
    model_.module().train();
    if (sync_ && !impl_->frozen.empty())
      return invalid_config(cfg_.file +
                            ": train.freeze: expected one device (freezing is not supported with "
                            "data-parallel ranks yet)");
    const bool frozen = tr.unfreeze_epoch == 0 || state_.epoch < tr.unfreeze_epoch;
    for (auto& p : impl_->frozen) p.set_requires_grad(!frozen);
    impl_->optimizer->zero_grad();
    impl_->loss_sums.zero_();
    impl_->window_steps = 0;
    impl_->epoch_steps = 0;
    const std::int64_t skipped_at_start = state_.skipped_steps;
    const auto t_epoch = Clock::now();
    EpochInfo ep;
    ep.epoch = state_.epoch;
    std::int64_t samples_total = 0;
    while (true) {
      if (tr.steps_per_epoch > 0 && ep.steps >= tr.steps_per_epoch) break;
      if (observer.should_stop()) break;
      SEGFLOW_ASSIGN_OR_RETURN(StepInfo si, train_step(source, total_steps, observer));
      if (si.micro_batches == 0) break;
      ++ep.steps;
      samples_total += si.samples;
      ep.data_wait_s += si.data_wait_s;
      ep.lr = si.lr;
      if (si.data_ended) break;
    }
    // The epoch's figures: one more read, which also waits for the device to finish.
    const Impl::StatsRead r = impl_->read_stats();
    state_.skipped_steps = r.skipped_total;
    state_.loss_scale = r.loss_scale;
    impl_->last_scale = r.loss_scale;
    ep.skipped_steps = r.skipped_total - skipped_at_start;
    ep.seconds = seconds_since(t_epoch);
    ep.loss = ep.steps ? r.epoch_loss_sum / static_cast<double>(ep.steps) : 0.0;
    ep.samples_per_s = ep.seconds > 0 ? static_cast<double>(samples_total) / ep.seconds : 0.0;
    ++state_.epoch;
    return ep;
  } catch (const std::exception& e) {
    return internal_error("training epoch " + std::to_string(state_.epoch) + ": " + first_line(e));
  }
}

at::Tensor Trainer::predict(const at::Tensor& image, const at::Tensor& box) const {
  BindDevice bind(device_);
  torch::NoGradGuard ng;
  const auto& info = model_.info();
  at::Tensor x = image.to(device_, at::kFloat).unsqueeze(0);  // (1, C, *spatial)
  AutocastGuard ac(device_, cfg_.train.amp);
  if (info.needs_box) {
    at::Tensor b = box.to(device_, at::kFloat).reshape({1, 4});
    return model_.predict(x, b).to(at::kFloat)[0];
  }
  SlidingWindowOptions sw;
  sw.overlap = cfg_.validation.overlap;
  sw.sw_batch_size = cfg_.validation.sw_batch_size;
  sw.mode = blend_mode(cfg_.validation.mode);  // logits blended (validation's argmax and Dice)
  // Config sizes are (x, y, z); tensors are (Z, Y, X).
  std::vector<std::int64_t> roi(cfg_.validation.roi_size.rbegin(), cfg_.validation.roi_size.rend());
  const bool cl = cfg_.train.channels_last;
  auto predictor = [&](const at::Tensor& w) {
    impl_->threads->update();
    const at::Tensor in =
        cl && w.dim() == info.spatial_dims + 2 ? w.contiguous(channels_last_format(info.spatial_dims)) : w;
    return model_.predict(in).to(at::kFloat);
  };
  if (info.spatial_dims == 2 && x.dim() == 5) {
    // A 2D model on a volume: slices as a batch, (Z, C, Y, X).
    at::Tensor slices = x[0].permute({1, 0, 2, 3}).contiguous();
    if (roi.size() == 3) roi = {roi[1], roi[2]};
    sw.roi_size = roi.empty() ? std::vector<std::int64_t>{slices.size(2), slices.size(3)} : roi;
    at::Tensor out = sliding_window_inference(slices, sw, predictor);  // (Z, K, Y, X)
    return out.permute({1, 0, 2, 3}).contiguous();
  }
  sw.roi_size = roi;
  return sliding_window_inference(x, sw, predictor)[0];
}

Result<ValidationInfo> Trainer::validate(const std::vector<Sample>& samples) {
  try {
    BindDevice bind(device_);
    const auto t0 = Clock::now();
    model_.module().eval();
    DiceMetricOptions mo;
    mo.num_classes = model_.info().out_channels == 1 ? 2 : num_classes_;
    DiceMetric metric(mo);
    for (const auto& s : samples) {
      at::Tensor box = s.has("box") ? s.at("box") : at::Tensor();
      at::Tensor logits = predict(s.at("image"), box);
      at::Tensor label = s.at("label").to(device_).to(at::kLong);
      metric.update_from_logits(logits.unsqueeze(0), label.unsqueeze(0));
    }
    model_.module().train();
    ValidationInfo v;
    v.epoch = state_.epoch - 1;
    v.dice_per_class = metric.per_class();
    v.class_names = class_names_;
    v.mean_dice = metric.mean();
    v.cases = static_cast<std::int64_t>(samples.size());
    v.seconds = seconds_since(t0);
    return v;
  } catch (const std::exception& e) {
    return internal_error("validation: " + first_line(e));
  }
}

Result<std::optional<EarlyStopInfo>> Trainer::validate_epoch(const std::vector<Sample>& val,
                                                             const fs::path& run_dir,
                                                             TrainObserver& observer) {
  const auto& es = cfg_.train.early_stopping;
  bool reached = false;
  double value = std::numeric_limits<double>::quiet_NaN();
  if (!val.empty()) {  // rank 0 of a data-parallel run; the others validate nothing
    SEGFLOW_ASSIGN_OR_RETURN(ValidationInfo v, validate(val));
    if (es) {
      value = v.mean_dice;  // the one metric validation computes (early_stopping_metrics)
      early_stop_update(state_.early_stop, *es, value, v.epoch);
      reached = early_stop_reached(state_.early_stop, *es);
    }
    if (std::isfinite(v.mean_dice) && v.mean_dice > state_.best_metric) {
      state_.best_metric = v.mean_dice;
      state_.best_epoch = v.epoch;
      v.best = true;
      SEGFLOW_RETURN_IF_ERROR(save_checkpoint(RunLayout(run_dir).best_checkpoint()));
      observer.on_checkpoint(RunLayout(run_dir).best_checkpoint(), "best");
    }
    observer.on_validation(v);
  }
  if (!es) return std::optional<EarlyStopInfo>();
  if (sync_) reached = sync_->any(reached);  // every rank stops with the one that validates
  if (!reached) return std::optional<EarlyStopInfo>();
  EarlyStopInfo info = early_stop_info(state_.early_stop, *es, state_.epoch - 1, value);
  // A data-parallel rank that validates nothing only follows the decision; its reason would be empty.
  log::info("early stopping after epoch " + std::to_string(state_.epoch) + ": " +
            (val.empty() ? std::string("the validating rank stopped") : early_stop_reason(info)));
  observer.on_early_stop(info);
  return std::optional<EarlyStopInfo>(info);
}

bool Trainer::stopped_early_before(TrainObserver& observer) {
  const auto& es = cfg_.train.early_stopping;
  if (!es) return false;
  early_stop_align(state_.early_stop, *es);
  if (!early_stop_reached(state_.early_stop, *es)) return false;
  EarlyStopInfo info = early_stop_info(state_.early_stop, *es, state_.epoch - 1, state_.early_stop.best);
  info.earlier = true;
  log::info("early stopping: the run had stopped after epoch " + std::to_string(state_.epoch) + " (" +
            early_stop_reason(info) + "); raise train.early_stopping.patience to train on");
  observer.on_early_stop(info);
  return true;
}

Status Trainer::fit(pipeline::BatchSource& source, std::int64_t steps_per_epoch,
                    const std::vector<Sample>& val, const fs::path& run_dir, TrainObserver& observer) {
  const auto& tr = cfg_.train;
  if (stopped_early_before(observer)) return Status::ok();
  if (const auto& r = impl_->weights_report; !r.path.empty() || !r.frozen.empty())
    SEGFLOW_RETURN_IF_ERROR(
        write_file_atomically(RunLayout(run_dir).weights_report(), r.to_json().dump(2) + '\n'));
  while (state_.epoch < tr.epochs) {
    observer.on_epoch_start(state_.epoch, tr.epochs);
    SEGFLOW_ASSIGN_OR_RETURN(EpochInfo ep, train_epoch(source, steps_per_epoch, observer));
    observer.on_epoch_end(ep);
    const bool last = state_.epoch >= tr.epochs;
    const bool stopping = observer.should_stop();
    std::optional<EarlyStopInfo> early;
    if (tr.val_interval > 0 && (state_.epoch % tr.val_interval == 0 || last)) {
      SEGFLOW_ASSIGN_OR_RETURN(early, validate_epoch(val, run_dir, observer));
    }
    if (state_.epoch % tr.checkpoint_interval == 0 || last || stopping || early) {
      SEGFLOW_RETURN_IF_ERROR(save_checkpoint(RunLayout(run_dir).last_checkpoint()));
      observer.on_checkpoint(RunLayout(run_dir).last_checkpoint(), "last");
    }
    if (stopping || early) break;
  }
  return Status::ok();
}

}  // namespace segflow::models
