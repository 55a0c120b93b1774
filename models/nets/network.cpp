#include "models/nets/network.hpp"

#include <torch/nn/module.h>

#include <algorithm>

#include "models/nets/axis_sizes.hpp"
#include "pipeline/options.hpp"
#include "pipeline/pipeline_spec.hpp"

namespace segflow::models {

ModelHandle::ModelHandle(ModelInfo info, std::shared_ptr<torch::nn::Module> module, ForwardFn forward)
    : info_(std::move(info)), module_(std::move(module)), forward_(std::move(forward)) {}

std::vector<at::Tensor> ModelHandle::forward(const at::Tensor& image, const at::Tensor& box) const {
  return forward_(*module_, image, box);
}

at::Tensor ModelHandle::predict(const at::Tensor& image, const at::Tensor& box) const {
  return forward(image, box).front();
}

ModelHandle ModelHandle::clone(const std::optional<c10::Device>& device) const {
  return ModelHandle(info_, module_->clone(device), forward_);
}

std::vector<at::Tensor> ModelHandle::trainable_parameters() const {
  std::vector<at::Tensor> out;
  for (const auto& p : module_->parameters())
    if (p.requires_grad()) out.push_back(p);
  return out;
}

Status check_input_size(const ModelInfo& info, const std::vector<std::int64_t>& xyz,
                        const std::string& field) {
  if (info.fixed_size > 0) return Status::ok();
  const auto& div = info.size_divisors;
  for (std::size_t a = 0; a < std::min(xyz.size(), div.size()); ++a) {
    if (xyz[a] <= 0 || xyz[a] % div[a] == 0) continue;
    const char axis[] = {"xyz"[a], '\0'};
    return invalid_config(field + ": expected a multiple of " + std::to_string(div[a]) + " on " + axis +
                          " (the product of model.strides on " + axis + "; per axis " +
                          axis_order_text(static_cast<int>(div.size())) + ": " +
                          pipeline::format_value(nlohmann::json(div)) + "), got " +
                          pipeline::format_value(nlohmann::json(xyz)));
  }
  return Status::ok();
}

Status check_input_sizes(const ModelInfo& info, const pipeline::PipelineSpec& stages,
                         const std::vector<std::int64_t>& roi_size, const std::string& label) {
  for (std::size_t i = 0; i < stages.stages.size(); ++i) {
    const auto& st = stages.stages[i];
    const auto it = st.options.find("spatial_size");
    if (st.name.find("crop") == std::string::npos || it == st.options.end()) continue;
    std::vector<std::int64_t> xyz;
    if (it->is_number_integer()) xyz.assign(3, it->get<std::int64_t>());
    if (it->is_array())
      for (const auto& v : *it) xyz.push_back(v.is_number_integer() ? v.get<std::int64_t>() : 0);
    SEGFLOW_RETURN_IF_ERROR(check_input_size(
        info, xyz, label + ": " + stages.path + "[" + std::to_string(i) + "].options.spatial_size"));
  }
  return check_input_size(info, roi_size, label + ": validation.roi_size");
}

std::string ModelOptions::name() const { return network ? network->name : std::string(); }

bool WeightsOptions::is_default() const {
  return names == "auto" && skip.empty() && !reinit_head && channels == "none";
}

}  // namespace segflow::models
