#pragma once
// An ONNX model as plain data, and the one function that turns it into a checked .onnx file.
// Torch-free on purpose: LibTorch bundles its own protobuf headers, which clash with the
// system protobuf that Debian's libonnx is built against, so the ONNX side lives in its own
// library (segflow_onnx, models/interop/onnx/CMakeLists.txt) that never sees a LibTorch header, and
// the LibTorch side (models/interop/onnx_export.hpp) describes the network with these structs only.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace segflow::onnx_graph {

/// Element types segflow writes (ONNX TensorProto.DataType values).
enum class ElemType : int { float32 = 1, int64 = 7, float16 = 10 };

/// A constant tensor (a weight, a shape): raw little-endian bytes, row-major.
struct Initializer {
  std::string name;
  ElemType type = ElemType::float32;
  std::vector<int64_t> dims;
  std::string raw;
};

/// A node attribute: ints (a list), one int, one float or a string.
struct Attribute {
  enum class Kind { ints, i, f, s };
  std::string name;
  Kind kind = Kind::ints;
  std::vector<int64_t> ints;
  int64_t i = 0;
  float f = 0.0F;
  std::string s;

  static Attribute list(std::string name, std::vector<int64_t> values);
  static Attribute integer(std::string name, int64_t value);
  static Attribute real(std::string name, float value);
};

struct Node {
  std::string op;  ///< ONNX operator type in the default domain ("Conv", "Concat", ...)
  std::string name;
  std::vector<std::string> inputs, outputs;
  std::vector<Attribute> attributes;
};

/// One axis of a graph input/output: a fixed size (value >= 0) or a symbolic name.
struct Dim {
  int64_t value = -1;
  std::string param;
};

struct ValueInfo {
  std::string name;
  ElemType type = ElemType::float32;
  std::vector<Dim> shape;
};

struct Graph {
  std::string name;
  std::string doc;
  int opset = 17;
  std::string producer = "segflow";
  std::vector<Node> nodes;  ///< in topological order
  std::vector<Initializer> initializers;
  std::vector<ValueInfo> inputs, outputs;
  std::vector<std::pair<std::string, std::string>> metadata;  ///< model metadata_props
};

/// The opsets this writer accepts (the ONNX library's range that segflow's ops exist in).
int min_opset();
int max_opset();

/// Builds the ModelProto, runs the ONNX checker and strict shape/type inference on it, and
/// serialises it into `bytes`. Returns "" on success, else the error (the checker's message
/// naming the node). The caller writes the bytes (write_file_atomically on the LibTorch side).
std::string serialize_model(const Graph& graph, std::string& bytes);

}  // namespace segflow::onnx_graph
