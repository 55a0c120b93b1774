#include "models/nets/registry.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <regex>

#include "models/nets/plain_unet.hpp"
#include "models/nets/res_enc_unet.hpp"
#include "models/nets/sam.hpp"
#include "models/nets/unet.hpp"
#include "pipeline/options.hpp"

namespace segflow::models {

using pipeline::OptionParser;

const std::vector<NetworkRow>& network_table() {
  // One row per network; add a network here (and nowhere else in this file).
  static const std::vector<NetworkRow> rows = {
      unet_network(),
      plain_unet_network(),
      res_enc_unet_network(),
      sam_network(),
  };
  return rows;
}

std::vector<std::string> known_models() {
  std::vector<std::string> names;
  for (const auto& r : network_table()) names.push_back(r.name);
  return names;
}

std::vector<std::string> weights_name_schemes() {
  std::vector<std::string> out{"auto", "segflow"};
  for (const auto& r : network_table())
    for (const auto& f : r.foreign_names)
      if (std::find(out.begin(), out.end(), f.scheme) == out.end()) out.push_back(f.scheme);
  return out;
}

namespace {

/// "auto, segflow, monai (MONAI's UNet), nnunet (nnU-Net's PlainConvUNet)".
std::string name_schemes_text() {
  std::string s = "auto, segflow";
  std::vector<std::string> seen;
  for (const auto& r : network_table())
    for (const auto& f : r.foreign_names)
      if (std::find(seen.begin(), seen.end(), f.scheme) == seen.end()) {
        seen.push_back(f.scheme);
        s += ", " + f.scheme + " (" + f.what + ")";
      }
  return s;
}

/// "unet, plain_unet, res_enc_unet, sam".
std::string known_list() {
  std::string s;
  for (const auto& n : known_models()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

/// "unet (MONAI's UNet), plain_unet (nnU-Net's PlainConvUNet) or sam (...)".
std::string described_list() {
  const auto& rows = network_table();
  std::string s;
  for (std::size_t i = 0; i < rows.size(); ++i)
    s += (i == 0                 ? ""
          : i + 1 == rows.size() ? " or "
                                 : ", ") +
         rows[i].name + " (" + rows[i].description + ")";
  return s;
}

/// `model.weights` as a mapping: {path, names, skip, reinit_head, channels}.
struct WeightsSection {
  ModelOptions& m;
  void bind(OptionParser& p) {
    WeightsOptions& w = m.weights_options;
    p.string("path", m.weights, "segflow tensor archive (.sfta)");
    p.choice("names", w.names, weights_name_schemes(),
             ("whose names the archive holds: " + name_schemes_text()).c_str());
    p.strings("skip", w.skip, false, "regexes over segflow names: those tensors keep their fresh init");
    p.boolean("reinit_head", w.reinit_head, "the output layer keeps its fresh init (another class count)");
    p.choice("channels", w.channels, channel_adaptations(),
             "first-conv input-channel adaptation when the channel counts differ: none, repeat, mean");
    for (const auto& r : w.skip) {
      try {
        std::regex re(r, std::regex::ECMAScript);
      } catch (const std::regex_error& e) {
        p.fail("skip", "expected regular expressions, got '" + r + "' (" + e.what() + ")");
      }
    }
    if (p.ok() && m.weights.empty()) p.fail("path", "expected the path of a tensor archive, got nothing");
  }
};

/// `weights`: a path, or a mapping (resolved as a mapping when it holds more than a path).
void bind_weights(OptionParser& p, ModelOptions& m) {
  static constexpr const char* kDoc =
      "segflow tensor archive loaded after construction, or {path, names, skip, reinit_head, channels}; "
      "\"\" = none";
  const nlohmann::json* given = p.given("weights");
  if ((given && given->is_object()) || (!given && !m.weights_options.is_default())) {
    WeightsSection section{m};
    p.section("weights", section, kDoc);
  } else {
    p.string("weights", m.weights, kDoc);
  }
}

/// The network's keys, then the keys every model has.
void bind_model(OptionParser& p, ModelOptions& m) {
  m.network->bind(p, m.net);
  bind_weights(p, m);
  p.boolean("weights_strict", m.weights_strict, "every archive tensor must match a parameter or buffer");
}

/// Reads the keys of network `row` and the common keys into `m`; the parser's first error or
/// unknown key.
Status read_model(const NetworkRow& row, OptionParser& p, ModelOptions& m) {
  m.network = &row;
  m.net = row.defaults();
  bind_model(p, m);
  return p.finish();
}

}  // namespace

Result<const NetworkRow*> find_network(const std::string& name) {
  for (const auto& r : network_table())
    if (r.name == name) return &r;
  return invalid_argument("model: unknown name '" + name + "'; known models: " + known_list());
}

Result<ModelOptions> parse_model_options(const nlohmann::json& j, const std::string& where) {
  OptionParser p(j, where);
  std::string name;
  p.choice("name", name, known_models(), ("the network: " + described_list()).c_str());
  if (p.ok() && !p.given("name")) p.fail("name", "expected a model name (" + known_list() + "), got nothing");
  if (!p.ok()) return p.finish();  // which keys are known depends on the name
  ModelOptions m;
  SEGFLOW_RETURN_IF_ERROR(read_model(**find_network(name), p, m));
  return m;
}

void to_json(nlohmann::json& j, const ModelOptions& options) {
  ModelOptions m = options;
  OptionParser p(nlohmann::json::object(), "");
  std::string name = m.name();
  p.choice("name", name, known_models(), "the network");
  if (m.network) bind_model(p, m);
  j = p.resolved();
}

Result<ModelHandle> create_model(const ModelOptions& options, WeightsReport* report) {
  if (!options.network)
    return invalid_argument("model: no network chosen (model.name: " + known_list() + ")");
  Result<ModelHandle> made = invalid_argument("");
  try {
    made = options.network->build(options.net);
  } catch (const std::exception& e) {
    return invalid_argument(options.name() + ": " + first_line(e));
  }
  if (!made.is_ok()) return made;
  if (!options.weights.empty()) {
    SEGFLOW_ASSIGN_OR_RETURN(
        WeightsReport r, load_pretrained(made->module(), options, options.weights, options.weights_options,
                                         options.weights_strict));
    if (report) *report = std::move(r);
  }
  return made;
}

Result<ModelHandle> create_model(const std::string& name, const nlohmann::json& options) {
  SEGFLOW_ASSIGN_OR_RETURN(const NetworkRow* row, find_network(name));
  ModelOptions m;
  OptionParser p(options, name);
  SEGFLOW_RETURN_IF_ERROR(read_model(*row, p, m));
  return create_model(m);
}

}  // namespace segflow::models
