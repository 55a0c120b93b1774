#include "models/nets/nnunet_names.hpp"

#include <regex>

namespace segflow::models {

Result<std::vector<std::string>> nnunet_plain_names(const std::string& name) {
  static const std::regex kEncoder(R"(encoder_stages\.(\d+)\.(\d+)\.(conv|norm)\.(\w+))");
  static const std::regex kDecoder(R"(decoder_stages\.(\d+)\.(\d+)\.(conv|norm)\.(\w+))");
  static const std::regex kOther(R"((transpconvs|seg_layers)\.(\d+)\.(\w+))");
  std::smatch m;
  // A conv block's conv and norm are also all_modules.0 and .1 (no dropout); the decoder
  // holds the encoder again as decoder.encoder.
  auto block = [&](const std::string& stem) {
    const std::string leaf = m[4].str();
    return std::vector<std::string>{stem + m[3].str() + "." + leaf,
                                    stem + "all_modules." + (m[3] == "conv" ? "0." : "1.") + leaf};
  };
  if (std::regex_match(name, m, kEncoder)) {
    auto names = block("encoder.stages." + m[1].str() + ".0.convs." + m[2].str() + ".");
    names.push_back("decoder." + names[0]);
    names.push_back("decoder." + names[1]);
    return names;
  }
  if (std::regex_match(name, m, kDecoder))
    return block("decoder.stages." + m[1].str() + ".convs." + m[2].str() + ".");
  if (std::regex_match(name, m, kOther))
    return std::vector<std::string>{"decoder." + m[1].str() + "." + m[2].str() + "." + m[3].str()};
  return invalid_argument("export: '" + name + "' is not a PlainConvUNet tensor");
}

std::string segflow_name_nnunet(const std::string& name) {
  static const std::regex kEncoder(R"(encoder\.stages\.(\d+)\.0\.convs\.(\d+)\.(conv|norm)\.(\w+))");
  static const std::regex kDecoder(R"(decoder\.stages\.(\d+)\.convs\.(\d+)\.(conv|norm)\.(\w+))");
  static const std::regex kOther(R"(decoder\.(transpconvs|seg_layers)\.(\d+)\.(\w+))");
  std::smatch m;
  if (std::regex_match(name, m, kEncoder))
    return "encoder_stages." + m[1].str() + "." + m[2].str() + "." + m[3].str() + "." + m[4].str();
  if (std::regex_match(name, m, kDecoder))
    return "decoder_stages." + m[1].str() + "." + m[2].str() + "." + m[3].str() + "." + m[4].str();
  if (std::regex_match(name, m, kOther)) return m[1].str() + "." + m[2].str() + "." + m[3].str();
  return "";
}

}  // namespace segflow::models
