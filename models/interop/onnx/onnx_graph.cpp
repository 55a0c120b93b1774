// The ONNX side of the export: segflow's plain Graph -> onnx::ModelProto, checked, written.
#include "models/interop/onnx/onnx_graph.hpp"

#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <exception>

namespace segflow::onnx_graph {

Attribute Attribute::list(std::string name, std::vector<int64_t> values) {
  Attribute a;
  a.name = std::move(name);
  a.kind = Kind::ints;
  a.ints = std::move(values);
  return a;
}

Attribute Attribute::integer(std::string name, int64_t value) {
  Attribute a;
  a.name = std::move(name);
  a.kind = Kind::i;
  a.i = value;
  return a;
}

Attribute Attribute::real(std::string name, float value) {
  Attribute a;
  a.name = std::move(name);
  a.kind = Kind::f;
  a.f = value;
  return a;
}

int min_opset() { return 13; }
int max_opset() { return 17; }

namespace {

void set_type(onnx::ValueInfoProto* v, const ValueInfo& info) {
  v->set_name(info.name);
  auto* tensor = v->mutable_type()->mutable_tensor_type();
  tensor->set_elem_type(static_cast<int>(info.type));
  auto* shape = tensor->mutable_shape();
  for (const Dim& d : info.shape) {
    auto* dim = shape->add_dim();
    if (d.value >= 0) {
      dim->set_dim_value(d.value);
    } else {
      dim->set_dim_param(d.param);
    }
  }
}

void add_attribute(onnx::NodeProto* n, const Attribute& a) {
  auto* p = n->add_attribute();
  p->set_name(a.name);
  switch (a.kind) {
    case Attribute::Kind::ints:
      p->set_type(onnx::AttributeProto::INTS);
      for (int64_t v : a.ints) p->add_ints(v);
      break;
    case Attribute::Kind::i:
      p->set_type(onnx::AttributeProto::INT);
      p->set_i(a.i);
      break;
    case Attribute::Kind::f:
      p->set_type(onnx::AttributeProto::FLOAT);
      p->set_f(a.f);
      break;
    case Attribute::Kind::s:
      p->set_type(onnx::AttributeProto::STRING);
      p->set_s(a.s);
      break;
  }
}

onnx::ModelProto to_proto(const Graph& graph) {
  onnx::ModelProto m;
  m.set_ir_version(onnx::IR_VERSION);
  m.set_producer_name(graph.producer);
  m.set_doc_string(graph.doc);
  auto* opset = m.add_opset_import();
  opset->set_domain("");
  opset->set_version(graph.opset);
  for (const auto& [key, value] : graph.metadata) {
    auto* p = m.add_metadata_props();
    p->set_key(key);
    p->set_value(value);
  }
  auto* g = m.mutable_graph();
  g->set_name(graph.name);
  for (const Initializer& init : graph.initializers) {
    auto* t = g->add_initializer();
    t->set_name(init.name);
    t->set_data_type(static_cast<int>(init.type));
    for (int64_t d : init.dims) t->add_dims(d);
    t->set_raw_data(init.raw);
  }
  for (const ValueInfo& v : graph.inputs) set_type(g->add_input(), v);
  for (const ValueInfo& v : graph.outputs) set_type(g->add_output(), v);
  for (const Node& node : graph.nodes) {
    auto* n = g->add_node();
    n->set_op_type(node.op);
    n->set_name(node.name);
    for (const auto& in : node.inputs) n->add_input(in);
    for (const auto& out : node.outputs) n->add_output(out);
    for (const Attribute& a : node.attributes) add_attribute(n, a);
  }
  return m;
}

}  // namespace

std::string serialize_model(const Graph& graph, std::string& bytes) {
  if (graph.opset < min_opset() || graph.opset > max_opset())
    return "opset " + std::to_string(graph.opset) + ": expected " + std::to_string(min_opset()) + ".." +
           std::to_string(max_opset()) + " (the ONNX library this segflow was built with checks up to " +
           std::to_string(max_opset()) + ")";
  onnx::ModelProto model = to_proto(graph);
  try {
    onnx::checker::check_model(model);
    // Strict inference on a copy: a type or shape mismatch between nodes is an error here,
    // not a failure in the user's runtime.
    onnx::ModelProto inferred = model;
    onnx::shape_inference::InferShapes(inferred, onnx::OpSchemaRegistry::Instance(),
                                       onnx::ShapeInferenceOptions(/*check_type=*/true, /*strict_mode=*/1));
  } catch (const std::exception& e) {
    return std::string("ONNX checker: ") + e.what();
  }
  if (!model.SerializeToString(&bytes)) return "cannot serialise the model";
  return {};
}

}  // namespace segflow::onnx_graph
