// segflow import --from nnunet RESULTS_DIR/fold_K --out DIR: an nnU-Net v2 model as a segflow
// checkpoint and job config (models/interop/nnunet_import.hpp).
// segflow import --from monai MODEL.pt|BUNDLE_DIR --out DIR: MONAI UNet weights, the same way
// (models/interop/monai_import.hpp import_monai); a bare MODEL.pt takes the UNet's arguments as options.
#include <nlohmann/json.hpp>

#include <iostream>
#include <sstream>

#include "apps/cli_args.hpp"
#include "apps/commands.hpp"
#include "models/interop/monai_import.hpp"
#include "models/interop/nnunet_import.hpp"

namespace segflow::apps {

namespace {

constexpr const char* kImportUsage =
    "usage: segflow import --from nnunet RESULTS_DIR/fold_K --out DIR | --from monai MODEL.pt|BUNDLE_DIR "
    "--out "
    "DIR [--layout monai|segflow] [--spatial-dims N --in-channels N --out-channels N --channels A,B,.. "
    "--strides S,S,.. --num-res-units N --kernel-size K --up-kernel-size K --norm batch|instance --act NAME "
    "--dropout P --bias true|false]";

constexpr Option kImportOptions[] = {
    {"from", "nnunet|monai", "what SOURCE is: an nnU-Net v2 results fold, or MONAI UNet weights; required"},
    {"out", "DIR", "the folder to write (job.yaml, model.pt, weights.sfta); must not exist; required"},
};
/// --layout, then a bare MODEL.pt's UNet arguments: MONAI's names with '-' for '_', its defaults.
constexpr Option kMonaiOptions[] = {
    {"layout", "monai|segflow",
     "monai (default): weights trained by MONAI, kernel axes reversed for its (x, y, z) arrays; segflow: "
     "what `segflow export --to pytorch` wrote"},
    {"spatial-dims", "N", "2 or 3; required"},
    {"in-channels", "N", "input channels; required"},
    {"out-channels", "N", "output channels (classes, background included); required"},
    {"channels", "A,B,..", "channels per level; required"},
    {"strides", "S,S,..",
     "stride per downsampling, S or SxSxS per entry (x, y, z with --layout monai); required"},
    {"num-res-units", "N", "residual units per block; default 0"},
    {"kernel-size", "K", "K or KxKxK; default 3"},
    {"up-kernel-size", "K", "K or KxKxK; default 3"},
    {"norm", "batch|instance", "default instance (not affine)"},
    {"act", "NAME", "relu, prelu (default), leakyrelu or gelu"},
    {"dropout", "P", "default 0"},
    {"bias", "true|false", "default true"},
};

/// How each MONAI argument of kMonaiOptions after --layout is read, in the table's order: i
/// integer, l list, k size (K or KxKxK), s string, f float, b bool.
constexpr std::string_view kMonaiKinds = "iiillikkssfb";
static_assert(kMonaiKinds.size() + 1 == std::size(kMonaiOptions));

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
  for (std::size_t i = 0; i < kMonaiKinds.size(); ++i) {
    const std::string option(kMonaiOptions[i + 1].name);
    if (!a.has(option)) continue;
    auto v = monai_arg_value(option, kMonaiKinds[i], a.get(option));
    if (!v.is_ok()) return fail("import", v.status());
    std::string name = option;  // MONAI's argument name
    for (char& ch : name)
      if (ch == '-') ch = '_';
    args[name] = *v;
  }
  auto r = models::import_monai(a.positional[0], args, a.get("layout", "monai"), a.get("out"));
  if (!r.is_ok()) return fail("import", r.status());
  std::cout << r->to_json().dump() << '\n';
  return 0;
}

}  // namespace

const Command& import_command() {
  static const Command c{
      "import",
      cmd_import,
      {{"",
        "import --from nnunet RESULTS_DIR/fold_K --out DIR\n"
        "import --from monai MODEL.pt|BUNDLE_DIR --out DIR [--layout monai|segflow] "
        "[--spatial-dims N --in-channels N --out-channels N --channels A,B,.. --strides S,S,.. "
        "--num-res-units N --kernel-size K --up-kernel-size K --norm batch|instance --act NAME --dropout P "
        "--bias true|false]",
        "nnU-Net or MONAI UNet weights as a segflow checkpoint and job config",
        "Writes DIR/job.yaml, DIR/model.pt (for segflow infer) and DIR/weights.sfta (for model.weights); "
        "MONAI also DIR/import.json, printed (docs/how-to/pretrained-weights.md).",
        {{"SOURCE",
          "--from nnunet: RESULTS_DIR/fold_K (plans.json and dataset.json one folder up); --from monai: a "
          "bundle folder, or a state dict MODEL.pt with the UNet arguments below"}},
        {{"", kImportOptions},
         {"--from monai only (from --spatial-dims on: the UNet's arguments, for a bare MODEL.pt)",
          kMonaiOptions}}}}};
  return c;
}

int cmd_import(int argc, char** argv) {
  auto a = parse_args(argc, argv, 2, import_command().forms.front());
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
