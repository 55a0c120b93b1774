// Activation checkpointing (models/nets/recompute.hpp, train.activation_checkpointing): the
// recomputed backward gives the plain step's output, gradients and normalisation statistics,
// with dropout drawing the same masks; and it is really in the graph (the stages' backward
// nodes are the recomputing function's). Memory and time: bench/RESULTS.md.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "models/nets/plain_unet.hpp"
#include "models/nets/recompute.hpp"
#include "models/nets/res_enc_unet.hpp"
#include "models/nets/unet.hpp"

namespace sm = segflow::models;

namespace {

/// One forward and backward of `net` on `x` (with recomputation when `recompute`): the outputs,
/// the gradients of every parameter and the buffers after the step.
struct StepResult {
  std::vector<at::Tensor> outputs, grads, buffers;
  int recompute_nodes = 0;  ///< nodes of the recomputing function in the outputs' graph
};

/// How many nodes of the graph behind `outputs` are the recomputing function's.
int recompute_nodes(const std::vector<at::Tensor>& outputs) {
  std::vector<torch::autograd::Node*> todo;
  std::set<torch::autograd::Node*> seen;
  for (const auto& o : outputs)
    if (o.grad_fn()) todo.push_back(o.grad_fn().get());
  int n = 0;
  while (!todo.empty()) {
    torch::autograd::Node* node = todo.back();
    todo.pop_back();
    if (!seen.insert(node).second) continue;
    if (node->name().find("RecomputeFn") != std::string::npos) ++n;
    for (const auto& e : node->next_edges())
      if (e.function) todo.push_back(e.function.get());
  }
  return n;
}

template <typename Net, typename Forward>
StepResult step(Net& net, const at::Tensor& x, bool recompute, Forward forward) {
  StepResult r;
  net->zero_grad();
  torch::manual_seed(11);  // the same dropout masks in both runs
  std::vector<at::Tensor> outs;
  {
    sm::RecomputeScope scope(recompute);
    outs = forward(net, x);
  }
  at::Tensor loss = torch::zeros({});
  for (std::size_t i = 0; i < outs.size(); ++i)
    loss = loss + (outs[i] * torch::linspace(-1, 1, outs[i].numel()).view(outs[i].sizes())).sum() / (1.0 + i);
  r.recompute_nodes = recompute_nodes(outs);
  loss.backward();
  for (auto& o : outs) r.outputs.push_back(o.detach().clone());
  for (auto& p : net->parameters()) r.grads.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
  for (auto& b : net->buffers()) r.buffers.push_back(b.detach().clone());
  return r;
}

void check_equal(const StepResult& plain, const StepResult& re) {
  REQUIRE(plain.outputs.size() == re.outputs.size());
  for (std::size_t i = 0; i < plain.outputs.size(); ++i)
    CHECK(torch::allclose(plain.outputs[i], re.outputs[i]));
  REQUIRE(plain.grads.size() == re.grads.size());
  // Compared against the network's largest gradient: a conv bias before batch norm has a true
  // gradient of 0, so what both runs hold there is summation noise of the order of float
  // rounding of the large terms (1e-4 where weights reach 400), not a relative agreement. A
  // wrong dropout mask or statistics differ by the order of the gradients themselves.
  double largest = 0;
  for (const auto& g : plain.grads)
    if (g.defined()) largest = std::max(largest, g.abs().max().item<double>());
  REQUIRE(largest > 0);
  std::size_t compared = 0;
  for (std::size_t i = 0; i < plain.grads.size(); ++i) {
    CAPTURE(i);
    REQUIRE(plain.grads[i].defined() == re.grads[i].defined());
    if (!plain.grads[i].defined()) continue;
    const double diff = (plain.grads[i] - re.grads[i]).abs().max().item<double>();
    CAPTURE(diff);
    CHECK(diff <= 1e-5 * largest);
    ++compared;
  }
  CHECK(compared == plain.grads.size());
  REQUIRE(plain.buffers.size() == re.buffers.size());
  for (std::size_t i = 0; i < plain.buffers.size(); ++i) CHECK(torch::equal(plain.buffers[i], re.buffers[i]));
  // The stages are in the graph as recomputing nodes only when the scope is on.
  CHECK(plain.recompute_nodes == 0);
  CHECK(re.recompute_nodes > 0);
}

}  // namespace

TEST_CASE("a recomputed UNet step (batch norm, residual units, dropout) equals the plain step") {
  torch::manual_seed(3);
  sm::UNetOptions o;
  o.spatial_dims = 3;
  o.in_channels = 1;
  o.out_channels = 3;
  o.channels = {4, 8, 16};
  o.strides = {2, 2};
  o.num_res_units = 2;
  o.norm = sm::NormKind::batch;
  o.dropout = 0.2;
  sm::UNet a(o);
  auto b = std::dynamic_pointer_cast<sm::UNetImpl>(a->clone());
  REQUIRE(b);
  sm::UNet bn(b);
  a->train();
  bn->train();
  const at::Tensor x = torch::randn({2, 1, 16, 16, 16});
  auto fwd = [](sm::UNet& n, const at::Tensor& t) { return std::vector<at::Tensor>{n->forward(t)}; };
  const StepResult plain = step(a, x, false, fwd);
  const StepResult re = step(bn, x, true, fwd);
  check_equal(plain, re);
}

TEST_CASE("a recomputed PlainConvUNet step with deep supervision equals the plain step") {
  torch::manual_seed(4);
  sm::PlainConvUNetOptions o;
  o.spatial_dims = 3;
  o.in_channels = 2;
  o.num_classes = 3;
  o.n_stages = 3;
  o.base_features = 4;
  o.deep_supervision = true;
  sm::PlainConvUNet a(o);
  auto b = std::dynamic_pointer_cast<sm::PlainConvUNetImpl>(a->clone());
  REQUIRE(b);
  sm::PlainConvUNet bn(b);
  a->train();
  bn->train();
  const at::Tensor x = torch::randn({2, 2, 16, 16, 16});
  auto fwd = [](sm::PlainConvUNet& n, const at::Tensor& t) { return n->forward(t); };
  const StepResult plain = step(a, x, false, fwd);
  const StepResult re = step(bn, x, true, fwd);
  CHECK(plain.outputs.size() == 2);  // n_stages - 1 decoder stages, each with a head
  check_equal(plain, re);
}

TEST_CASE("a recomputed ResEncUNet step (batch norm, pooled and projected skips) equals the plain step") {
  torch::manual_seed(5);
  sm::ResEncUNetOptions o;
  o.spatial_dims = 3;
  o.in_channels = 1;
  o.num_classes = 3;
  o.n_stages = 3;
  o.base_features = 4;
  o.max_features = 8;  // stage 2 keeps stage 1's features: its skip only pools
  o.n_blocks_per_stage = {1, 2, 2};
  o.norm = sm::NormKind::batch;
  sm::ResEncUNet a(o);
  {  // the blocks' last norms away from their initial 0, so that the blocks' convs count
    torch::NoGradGuard ng;
    for (auto& p : a->named_parameters())
      if (p.key().find("conv2.norm.weight") != std::string::npos) p.value().fill_(0.7);
  }
  auto b = std::dynamic_pointer_cast<sm::ResEncUNetImpl>(a->clone());
  REQUIRE(b);
  sm::ResEncUNet bn(b);
  a->train();
  bn->train();
  const at::Tensor x = torch::randn({2, 1, 16, 16, 16});
  auto fwd = [](sm::ResEncUNet& n, const at::Tensor& t) { return n->forward(t); };
  const StepResult plain = step(a, x, false, fwd);
  const StepResult re = step(bn, x, true, fwd);
  CHECK(plain.outputs.size() == 2);
  check_equal(plain, re);
}

TEST_CASE("without a scope, or without gradients, a stage is a plain call") {
  sm::UNetOptions o;
  o.spatial_dims = 2;
  o.channels = {4, 8};
  o.strides = {2};
  sm::UNet net(o);
  const at::Tensor x = torch::randn({1, 1, 8, 8});
  CHECK_FALSE(sm::RecomputeScope::active());
  CHECK(recompute_nodes({net->forward(x)}) == 0);
  {
    sm::RecomputeScope on(true);
    CHECK(sm::RecomputeScope::active());
    torch::NoGradGuard ng;
    CHECK_FALSE(net->forward(x).grad_fn());
  }
  CHECK_FALSE(sm::RecomputeScope::active());
}
