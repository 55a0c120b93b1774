#include "models/nets/monai_names.hpp"

#include <regex>

namespace segflow::models {

namespace {

/// A ConvBlock's own names -> MONAI's Convolution (conv, adn.N, adn.A).
std::string monai_adn(const std::string& rest) {
  if (rest.rfind("norm.", 0) == 0) return "adn.N." + rest.substr(5);
  if (rest.rfind("act.", 0) == 0) return "adn.A." + rest.substr(4);
  return rest;  // conv.weight, conv.bias
}

}  // namespace

Result<std::string> monai_unet_name(const std::string& name, std::size_t levels, std::int64_t num_res_units) {
  static const std::regex kLevel(R"((down|up)\.(\d+)\.(.+))");
  auto nested = [](std::size_t level) {
    std::string s;
    for (std::size_t i = 0; i < level; ++i) s += "1.submodule.";
    return s;
  };
  // A ResidualUnit's own names: conv.K.* are MONAI's conv.unitK.*; without residual units
  // segflow still wraps the single block as conv.0, where MONAI has the Convolution itself.
  auto unit = [&](const std::string& rest) -> Result<std::string> {
    static const std::regex kSub(R"(conv\.(\d+)\.(.+))");
    std::smatch m;
    if (std::regex_match(rest, m, kSub)) {
      if (num_res_units == 0) {
        if (m[1] != "0") return invalid_argument("export: unexpected UNet tensor '" + rest + "'");
        return monai_adn(m[2]);
      }
      return "conv.unit" + m[1].str() + "." + monai_adn(m[2]);
    }
    if (rest.rfind("residual.", 0) == 0 && num_res_units > 0) return rest;
    return invalid_argument("export: unexpected UNet tensor '" + rest + "'");
  };
  if (name.rfind("bottom.", 0) == 0) {
    SEGFLOW_ASSIGN_OR_RETURN(std::string u, unit(name.substr(7)));
    return nested(levels) + u;
  }
  std::smatch m;
  if (!std::regex_match(name, m, kLevel))
    return invalid_argument("export: '" + name + "' is not a UNet tensor");
  const std::size_t level = std::stoul(m[2]);
  if (level >= levels) return invalid_argument("export: '" + name + "' is past the UNet's levels");
  const std::string rest = m[3];
  if (m[1] == "down") {
    SEGFLOW_ASSIGN_OR_RETURN(std::string u, unit(rest));
    return nested(level) + "0." + u;
  }
  // Up: MONAI's up layer is Sequential(transposed Convolution, ResidualUnit) with residual
  // units, the transposed Convolution alone without.
  if (rest.rfind("conv.", 0) == 0)
    return nested(level) + (num_res_units > 0 ? "2.0." : "2.") + monai_adn(rest.substr(5));
  if (rest.rfind("ru.", 0) == 0 && num_res_units > 0) {
    SEGFLOW_ASSIGN_OR_RETURN(std::string u, unit(rest.substr(3)));
    return nested(level) + "2.1." + u;
  }
  return invalid_argument("export: unexpected UNet tensor '" + name + "'");
}

std::map<std::string, std::string> segflow_names_from_monai(const std::vector<std::string>& segflow_names,
                                                            std::size_t levels, std::int64_t num_res_units) {
  std::map<std::string, std::string> out;
  for (const auto& name : segflow_names) {
    auto m = monai_unet_name(name, levels, num_res_units);
    if (m.is_ok()) out.emplace("model." + *m, name);
  }
  return out;
}

}  // namespace segflow::models
