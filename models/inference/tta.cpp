#include "models/inference/tta.hpp"

#include <nlohmann/json.hpp>

#include <set>

namespace segflow::models {

Result<TtaMode> parse_tta(const std::string& text) {
  if (text == "none") return TtaMode::none;
  if (text == "mirror") return TtaMode::mirror;
  if (text == "mirror-all") return TtaMode::mirror_all;
  return invalid_argument("--tta: expected none, mirror or mirror-all, got '" + text + "'");
}

std::vector<int> tta_mirror_axes(TtaMode tta, const nlohmann::json& training_stages, int spatial_dims) {
  std::set<int> axes;
  if (tta == TtaMode::mirror_all) {
    for (int a = 0; a < spatial_dims; ++a) axes.insert(a);
  } else if (tta == TtaMode::mirror && training_stages.is_array()) {
    for (const auto& st : training_stages) {
      if (st.value("name", "") != "rand_flip" || !st.contains("options")) continue;
      const auto& o = st["options"];
      if (o.value("prob", 0.0) <= 0.0 || !o.contains("spatial_axis")) continue;
      for (const auto& a : o["spatial_axis"])
        if (a.is_number_integer() && a.get<int>() >= 0 && a.get<int>() < spatial_dims)
          axes.insert(a.get<int>());
    }
  }
  return {axes.begin(), axes.end()};
}

const char* to_string(TtaMode tta) {
  switch (tta) {
    case TtaMode::none:
      return "none";
    case TtaMode::mirror:
      return "mirror";
    case TtaMode::mirror_all:
      return "mirror-all";
  }
  return "none";
}

at::Tensor mirror_averaged(const std::function<at::Tensor(const at::Tensor&)>& probabilities,
                           const at::Tensor& window, const std::vector<std::int64_t>& dims) {
  if (dims.empty()) return probabilities(window);
  at::Tensor sum;
  const int combos = 1 << dims.size();
  for (int m = 0; m < combos; ++m) {
    std::vector<std::int64_t> flip;
    for (std::size_t d = 0; d < dims.size(); ++d)
      if ((m >> d) & 1) flip.push_back(dims[d]);
    at::Tensor p = flip.empty() ? probabilities(window) : probabilities(window.flip(flip)).flip(flip);
    sum = sum.defined() ? sum + p : p;
  }
  return sum / static_cast<double>(combos);
}

}  // namespace segflow::models
