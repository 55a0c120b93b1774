#include "models/interop/export.hpp"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <algorithm>
#include <regex>
#include <string_view>

#include "messages/file_util.hpp"
#include "models/nets/registry.hpp"

namespace segflow::models {

namespace {

/// The networks of the table with a PyTorch export hook: "unet, plain_unet, res_enc_unet, sam".
std::string exportable_networks() {
  std::string s;
  for (const auto& r : network_table())
    if (r.pytorch) s += (s.empty() ? "" : ", ") + r.name;
  return s;
}

}  // namespace

Result<ExportedModel> export_model(const ModelOptions& options, const torch::nn::Module& module) {
  if (!options.network || !options.network->pytorch)
    return unsupported("export --to pytorch: network '" + options.name() +
                       "' has no PyTorch export (networks with one: " + exportable_networks() + ")");
  return options.network->pytorch(options.net, module);
}

std::vector<char> torch_save_bytes(const c10::IValue& value) {
  // torch::pickle_save tags typed dicts with torch.jit's restore_type_tag, which torch.load's
  // default weights_only unpickler refuses; so the archive torch.save writes is made here:
  // data.pkl (plain dicts, lists, tuples, strings, numbers, None and tensors, each tensor a
  // persistent id naming its storage record), byteorder and data/<i>, in the zip container
  // torch.load reads.
  std::vector<char> pickled;
  torch::jit::Pickler pickler([&](const char* b, std::size_t n) { pickled.insert(pickled.end(), b, b + n); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr,
                              /*memoized_class_types=*/nullptr, /*get_tensor_id=*/nullptr,
                              /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  std::vector<char> out;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* b, std::size_t n) {
    out.insert(out.end(), static_cast<const char*>(b), static_cast<const char*>(b) + n);
    return n;
  });
  writer.writeRecord("data.pkl", pickled.data(), pickled.size());
  static constexpr std::string_view kOrder = "little";
  writer.writeRecord("byteorder", kOrder.data(), kOrder.size());
  std::size_t i = 0;
  for (const at::Tensor& t : pickler.tensorData()) {
    const auto data = torch::jit::getWriteableTensorData(t);
    writer.writeRecord("data/" + std::to_string(i++), data.data(), data.sizeInBytes());
  }
  writer.writeEndOfFile();
  return out;
}

c10::Dict<std::string, at::Tensor> cpu_tensor_dict(
    const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, t] : tensors) dict.insert(name, t.detach().to(at::kCPU).contiguous().clone());
  return dict;
}

std::vector<char> pytorch_state_dict_bytes(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  return torch_save_bytes(c10::IValue(cpu_tensor_dict(tensors)));
}

Status write_pytorch_export(const ExportedModel& model, const std::filesystem::path& out) {
  const std::vector<char> bytes = pytorch_state_dict_bytes(model.state_dict);
  SEGFLOW_RETURN_IF_ERROR(write_file_atomically(out, std::string_view(bytes.data(), bytes.size())));
  std::filesystem::path spec = out;
  spec.replace_extension(".json");
  return write_file_atomically(spec, model.spec.dump(2) + '\n');
}

}  // namespace segflow::models
