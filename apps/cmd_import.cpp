// segflow import --from nnunet RESULTS_DIR/fold_K --out DIR: an nnU-Net v2 model as a segflow
// checkpoint and job config (models/nnunet_export.hpp import_nnunet).
// segflow import --from monai MODEL.pt|BUNDLE_DIR --out DIR: MONAI UNet weights, the same way
// (models/monai_import.hpp import_monai); a bare MODEL.pt takes the UNet's arguments as options.
#include <nlohmann/json.hpp>

#include <iostream>
#include <sstream>

#include "apps/cli_args.hpp"
#include "apps/commands.hpp"
#include "models/monai_import.hpp"
#include "models/nnunet_export.hpp"

namespace segflow::apps {

namespace {

constexpr const char* kImportUsage =
    "usage: segflow import --from nnunet RESULTS_DIR/fold_K --out DIR | --from monai MODEL.pt|BUNDLE_DIR "
    "--out "
    "DIR [--layout monai|segflow] [--spatial-dims N --in-channels N --out-channels N --channels A,B,.. "
    "--strides S,S,.. --num-res-units N --kernel-size K --up-kernel-size K --norm batch|instance --act NAME "
    "--dropout P --bias true|false]";

/// option -> (MONAI argument, kind): i integer, l list, k size (K or KxKxK), s string, f float,
/// b bool.
const std::map<std::string, std::pair<std::string, char>>& monai_arg_options() {
  static const std::map<std::string, std::pair<std::string, char>> k{
      {"spatial-dims", {"spatial_dims", 'i'}},
      {"in-channels", {"in_channels", 'i'}},
      {"out-channels", {"out_channels", 'i'}},
      {"channels", {"channels", 'l'}},
      {"strides", {"strides", 'l'}},
      {"num-res-units", {"num_res_units", 'i'}},
      {"kernel-size", {"kernel_size", 'k'}},
      {"up-kernel-size", {"up_kernel_size", 'k'}},
      {"norm", {"norm", 's'}},
      {"act", {"act", 's'}},
      {"dropout", {"dropout", 'f'}},
      {"bias", {"bias", 'b'}}};
  return k;
}

/// One option's text as MONAI's argument value. A list entry "2x2x1" is a per-axis stride.
Result<nlohmann::json> monai_arg_value(const std::string& option, char kind, const std::string& text) {
  const std::string where = "--" + option;
  if (kind == 's') return nlohmann::json(text);
  if (kind == 'b') {
    if (text != "true" && text != "false")
      return invalid_argument(where + ": expected true or false, got '" + text + "'");
    return nlohmann::json(text == "true");
  }
  if (kind == 'f') {
    try {
      return nlohmann::json(std::stod(text));
    } catch (const std::exception&) {
      return invalid_argument(where + ": expected a number, got '" + text + "'");
    }
  }
  if (kind == 'i') {
    SEGFLOW_ASSIGN_OR_RETURN(long long v, parse_int(where, text));
    return nlohmann::json(v);
  }
  nlohmann::json list = nlohmann::json::array();
  std::stringstream items(text);
  for (std::string item; std::getline(items, item, ',');) {
    nlohmann::json axes = nlohmann::json::array();
    std::stringstream parts(item);
    for (std::string p; std::getline(parts, p, 'x');) {
      SEGFLOW_ASSIGN_OR_RETURN(long long v, parse_int(where, p));
      axes.push_back(v);
    }
    if (axes.empty()) return invalid_argument(where + ": empty entry in '" + text + "'");
    list.push_back(axes.size() == 1 ? axes[0] : axes);
  }
  if (kind == 'k') {
    if (list.size() != 1) return invalid_argument(where + ": expected K or KxKxK, got '" + text + "'");
    return list[0];
  }
  return list;
}

int import_monai_command(const Args& a) {
  nlohmann::json args = nlohmann::json::object();
  for (const auto& [option, spec] : monai_arg_options()) {
    if (!a.has(option)) continue;
    auto v = monai_arg_value(option, spec.second, a.get(option));
    if (!v.is_ok()) return fail("import", v.status());
    args[spec.first] = *v;
  }
  auto r = models::import_monai(a.positional[0], args, a.get("layout", "monai"), a.get("out"));
  if (!r.is_ok()) return fail("import", r.status());
  std::cout << r->to_json().dump() << '\n';
  return 0;
}

}  // namespace

int cmd_import(int argc, char** argv) {
  std::set<std::string> with_value{"from", "out", "layout"};
  for (const auto& [option, spec] : monai_arg_options()) with_value.insert(option);
  auto a = parse_args(argc, argv, 2, with_value, {});
  if (!a.is_ok()) return fail("import", a.status());
  for (const char* k : {"from", "out"})
    if (!a->has(k))
      return fail("import", invalid_argument(std::string("--") + k + ": required (" + kImportUsage + ")"));
  const std::string from = a->get("from");
  if (from != "nnunet" && from != "monai")
    return fail("import", invalid_argument("--from: expected nnunet or monai, got '" + from + "'"));
  if (a->positional.size() != 1)
    return fail("import", invalid_argument("expected one source (" + std::string(kImportUsage) + "), got " +
                                           std::to_string(a->positional.size())));
  if (from == "monai") return import_monai_command(*a);
  for (const auto& [k, v] : a->values)
    if (k != "from" && k != "out")
      return fail("import", invalid_argument("--" + k + ": for --from monai only"));
  const std::filesystem::path out = a->get("out");
  auto ckpt = models::import_nnunet(a->positional[0], out);
  if (!ckpt.is_ok()) return fail("import", ckpt.status());
  std::cout << nlohmann::json{{"checkpoint", ckpt->string()}, {"config", (out / "job.yaml").string()}}.dump()
            << '\n';
  return 0;
}

}  // namespace segflow::apps
