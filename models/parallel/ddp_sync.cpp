#include "models/parallel/ddp_sync.hpp"

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include <algorithm>
#include <stdexcept>

#include "models/parallel/collective.hpp"

namespace segflow::models::parallel {

namespace {

/// GradientSync's methods cannot return a Status: the trainer turns exceptions into one.
void throw_if_error(const Status& st) {
  if (!st.is_ok()) throw std::runtime_error(st.message());
}

}  // namespace

DdpGradientSync::~DdpGradientSync() = default;

Result<std::shared_ptr<DdpGradientSync>> DdpGradientSync::create(Trainer& trainer,
                                                                 std::shared_ptr<Collective> collective,
                                                                 DdpOptions options) {
  return create(trainer.model().module(), trainer.parameters(), std::move(collective), options);
}

Result<std::shared_ptr<DdpGradientSync>> DdpGradientSync::create(torch::nn::Module& module,
                                                                 std::vector<at::Tensor> params,
                                                                 std::shared_ptr<Collective> collective,
                                                                 DdpOptions options) {
  if (!collective) return invalid_argument("ddp: no collective");
  if (params.empty()) return invalid_argument("ddp: the model has no trainable parameters");
  if (!(options.bucket_cap_mb > 0) || !(options.first_bucket_cap_mb > 0))
    return invalid_argument("ddp: bucket_cap_mb and first_bucket_cap_mb must be > 0, got " +
                            std::to_string(options.bucket_cap_mb) + " and " +
                            std::to_string(options.first_bucket_cap_mb));
  for (const auto& p : params) {
    if (p.device() != collective->device())
      return invalid_argument("ddp: a parameter is on " + p.device().str() + " but rank " +
                              std::to_string(collective->rank()) + " communicates on " +
                              collective->device().str());
    if (!p.requires_grad()) return invalid_argument("ddp: a parameter in the list does not require grad");
  }
  std::shared_ptr<DdpGradientSync> s(new DdpGradientSync());
  s->collective_ = std::move(collective);
  s->params_ = std::move(params);
  s->options_ = options;
  for (auto& b : module.buffers()) s->buffers_.push_back(b);
  try {
    const auto pg = s->collective_->process_group();
    // Same shapes everywhere, or a clear error now rather than a garbled all-reduce later.
    c10d::verify_params_across_processes(pg, s->params_, std::nullopt);

    // Every parameter and buffer from rank 0 (initial weights, or a resumed checkpoint's).
    std::vector<at::Tensor> state;
    for (auto& p : module.parameters()) state.push_back(p);
    for (auto& b : s->buffers_) state.push_back(b);
    SEGFLOW_RETURN_IF_ERROR(
        s->collective_->broadcast(state, 0).with_context("ddp: broadcasting the initial weights"));

    const auto cap = static_cast<std::int64_t>(options.bucket_cap_mb * 1024.0 * 1024.0);
    const auto first_cap = static_cast<std::int64_t>(options.first_bucket_cap_mb * 1024.0 * 1024.0);
    const std::vector<bool> sparse(s->params_.size(), false);
    auto [indices, limits] = c10d::compute_bucket_assignment_by_size(
        s->params_, {static_cast<std::size_t>(first_cap), static_cast<std::size_t>(cap)}, sparse);
    // Gradients arrive roughly in reverse parameter order: reduce the last buckets first.
    std::reverse(indices.begin(), indices.end());
    std::reverse(limits.begin(), limits.end());
    std::vector<std::int64_t> limits64(limits.begin(), limits.end());
    s->num_buckets_ = indices.size();
    s->reducer_ = std::make_unique<c10d::Reducer>(s->params_, std::move(indices), pg, sparse, cap,
                                                  /*find_unused_parameters=*/false,
                                                  /*gradient_as_bucket_view=*/false,
                                                  std::unordered_map<std::size_t, std::string>{}, first_cap,
                                                  /*skip_all_reduce_unused_params=*/false,
                                                  /*use_python_reducer=*/false, std::move(limits64));
  } catch (const std::exception& e) {
    return internal_error("ddp on rank " + std::to_string(s->collective_->rank()) + " of " +
                          std::to_string(s->collective_->world_size()) + ": " + first_line(e));
  }
  return s;
}

bool DdpGradientSync::all_have(bool have_batch) {
  auto r = collective_->all(have_batch);
  throw_if_error(r.status());
  return *r;
}

bool DdpGradientSync::any(bool flag) {
  auto r = collective_->any(flag);
  throw_if_error(r.status());
  return *r;
}

void DdpGradientSync::before_backward(const at::Tensor& loss, bool sync) {
  if (!sync) return;  // no_sync: the hooks stay idle, gradients accumulate locally
  // Once, after the first synchronised backward: buckets in the order gradients arrived
  // (a collective: rank 0's order is broadcast). Also what keeps the reducer from
  // recording that order forever.
  reducer_->rebuild_buckets();
  reducer_->prepare_for_backward({loss});
  ++reduced_steps_;
}

void DdpGradientSync::after_backward(bool synced) {
  // Buffers here, not before backward as DDP does before forward: batch norm's backward
  // reads the running statistics it saved, so overwriting them between forward and
  // backward is an autograd error. After the step every rank holds rank 0's statistics.
  if (options_.broadcast_buffers && !buffers_.empty() && collective_->world_size() > 1)
    throw_if_error(collective_->broadcast(buffers_, 0).with_context("ddp: broadcasting buffers"));
  if (synced) return;  // the reducer's end-of-backward callback wrote the averages
  std::vector<at::Tensor> grads;
  grads.reserve(params_.size());
  for (auto& p : params_) {
    // An undefined gradient still takes part (as zeros) so every rank reduces the same list.
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    grads.push_back(p.grad());
  }
  throw_if_error(collective_->allreduce_mean(grads).with_context("ddp: reducing a short accumulation step"));
  ++fallback_steps_;
}

}  // namespace segflow::models::parallel
