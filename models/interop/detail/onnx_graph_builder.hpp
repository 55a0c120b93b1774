#pragma once
// The LibTorch side of ONNX export: an onnx_graph::Graph built node by node from a module's
// tensors, shared by the UNet / plain_unet export (onnx_export.cpp) and the SAM export
// (onnx_export_sam.cpp). Module tensors become initializers named by their parameter or
// buffer names; with fp16 they are stored as float16 and Cast back to float32 in the graph.
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "models/interop/onnx/onnx_graph.hpp"

namespace segflow::models::detail {

class OnnxGraphBuilder {
 public:
  using Attr = onnx_graph::Attribute;

  OnnxGraphBuilder(const torch::nn::Module& module, bool fp16) : fp16_(fp16) {
    for (const auto& p : module.named_parameters()) names_[p.value().unsafeGetTensorImpl()] = p.key();
    for (const auto& b : module.named_buffers()) names_[b.value().unsafeGetTensorImpl()] = b.key();
  }

  /// A module tensor as an initializer (float16 + Cast when asked); its value name.
  std::string weight(const at::Tensor& t) {
    auto it = names_.find(t.unsafeGetTensorImpl());
    return constant(it != names_.end() ? it->second : fresh("const"), t);
  }

  /// A constant float tensor (ones for a norm without affine weights, GELU's scalars).
  std::string constant(const std::string& name, const at::Tensor& value) {
    const at::Tensor t = value.detach().to(at::kCPU, fp16_ ? at::kHalf : at::kFloat).contiguous();
    add_initializer(name, fp16_ ? onnx_graph::ElemType::float16 : onnx_graph::ElemType::float32, t);
    if (!fp16_) return name;
    return node("Cast", {name}, {Attr::integer("to", static_cast<int64_t>(onnx_graph::ElemType::float32))},
                name + ".f32");
  }

  /// Adds `op` reading `inputs`; returns its output's name (`out`, or a fresh one).
  std::string node(const std::string& op, std::vector<std::string> inputs, std::vector<Attr> attrs = {},
                   std::string out = {}) {
    if (out.empty()) out = fresh(op);
    onnx_graph::Node n;
    n.op = op;
    n.name = out;
    n.inputs = std::move(inputs);
    n.outputs = {out};
    n.attributes = std::move(attrs);
    graph.nodes.push_back(std::move(n));
    return out;
  }

  /// A name no other value has: "<what>_<n>".
  std::string fresh(const std::string& what) { return what + "_" + std::to_string(counter_++); }

  onnx_graph::Graph graph;

 protected:
  /// `t` (contiguous, on the CPU, of `type`'s element size) as the initializer `name`.
  void add_initializer(const std::string& name, onnx_graph::ElemType type, const at::Tensor& t) {
    onnx_graph::Initializer init;
    init.name = name;
    init.type = type;
    init.dims.assign(t.sizes().begin(), t.sizes().end());
    init.raw.assign(static_cast<const char*>(t.data_ptr()), t.nbytes());
    graph.initializers.push_back(std::move(init));
  }

 private:
  bool fp16_;
  int counter_ = 0;
  std::unordered_map<const c10::TensorImpl*, std::string> names_;
};

}  // namespace segflow::models::detail
