// segflow synth, segflow inspect.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "apps/cli_args.hpp"
#include "apps/commands.hpp"
#include "pipeline/inspect.hpp"
#include "pipeline/synth.hpp"

namespace segflow::apps {

/// Prints "segflow CMD: message" on stderr and returns the exit code for `st`.
int fail(const std::string& cmd, const Status& st) {
  std::fprintf(stderr, "segflow %s: %s\n", cmd.c_str(), st.message().c_str());
  const auto code = st.code();
  // Bad input: 2 (a label map without foreground is one for a DICOM SEG output); else 1.
  return code == segflow::ErrorCode::invalid_argument || code == segflow::ErrorCode::invalid_config ||
                 code == segflow::ErrorCode::no_foreground
             ? 2
             : 1;
}

namespace {

constexpr Option kSynthOptions[] = {
    {"out", "DIR", "output folder (created); required"},
    {"cases", "N", "number of cases, [1, 100000]; default 24"},
    {"size", "S", "in-plane size x = y in voxels, [16, 512]; default 96"},
    {"format", "dicom|nifti|npy",
     "nifti (default): MSD / nnU-Net v2 (dataset.json, imagesTr/, labelsTr/); dicom: a CT series and a DICOM "
     "SEG per case; npy: MedSAM's imgs/ and gts/"},
    {"compress", "none|rle|jpeg-ls|jpeg-lossless", "DICOM transfer syntax (dicom only); default none"},
    {"seed", "K", "dataset seed, >= 0; case i depends only on (seed, i); default 0"},
    {"spacing", "X,Y,Z", "a fixed voxel spacing in mm instead of the random anisotropic one"},
    {"spacing-jitter", "F",
     "with --spacing: each case's spacing times 1 + u, u uniform in [-F, F] (x and y share u), [0, 0.9]; "
     "default 0"},
    {"difficulty", "normal|hard",
     "hard: low contrast (organs 8-15 HU apart), strong noise and bias field, a thin spleen on the left "
     "kidney, "
     "the right kidney against the liver, 0.7 x 0.7 x 5 mm voxels unless --spacing; default normal"},
};
constexpr Option kInspectOptions[] = {
    {"json", "", "one JSON object instead of one `key: value` line per field"},
};

}  // namespace

const Command& synth_command() {
  static const Command c{
      "synth",
      cmd_synth,
      {{"",
        "synth --out DIR [--cases N] [--size S] [--format dicom|nifti|npy] "
        "[--compress none|rle|jpeg-ls|jpeg-lossless] [--seed K] [--spacing X,Y,Z [--spacing-jitter F]] "
        "[--difficulty normal|hard]",
        "write a synthetic CT-like dataset with label maps",
        "Each case is a body with four organ-like structures (liver 1, spleen 2, kidneys 3, spine 4), noise, "
        "a bias field, random anisotropic spacing and an oblique orientation on every third case; integer "
        "HU, so every format round-trips exactly.",
        {},
        {{"", kSynthOptions}}}}};
  return c;
}

const Command& inspect_command() {
  static const Command c{
      "inspect",
      cmd_inspect,
      {{"",
        "inspect PATH [--json]",
        "geometry and value summary of a file, series, case or dataset",
        "",
        {{"PATH",
          "a NIfTI, NRRD, MHA or npy file, a DICOM file or series folder, a case folder or a dataset"}},
        {{"", kInspectOptions}}}}};
  return c;
}

int cmd_synth(int argc, char** argv) {
  auto a = parse_args(argc, argv, 2, synth_command().forms.front());
  if (!a.is_ok()) return fail("synth", a.status());
  segflow::pipeline::SynthOptions o;
  o.out = a->get("out");
  o.format = a->get("format", o.format);
  o.compress = a->get("compress", o.compress);
  o.difficulty = a->get("difficulty", o.difficulty);
  for (auto [key, dst] : {std::pair{"cases", &o.cases}, std::pair{"size", &o.size}}) {
    if (!a->has(key)) continue;
    auto v = parse_int(std::string("--") + key, a->get(key));
    if (!v.is_ok()) return fail("synth", v.status());
    *dst = static_cast<int>(*v);
  }
  if (a->has("seed")) {
    auto v = parse_int("--seed", a->get("seed"));
    if (!v.is_ok() || *v < 0)
      return fail("synth", segflow::invalid_argument("--seed: expected an integer >= 0, got '" +
                                                     a->get("seed") + "'"));
    o.seed = static_cast<std::uint64_t>(*v);
  }
  if (a->has("spacing")) {
    const std::string t = a->get("spacing");
    double x = 0, y = 0, z = 0;
    char tail = 0;
    if (std::sscanf(t.c_str(), "%lf,%lf,%lf%c", &x, &y, &z, &tail) != 3)
      return fail("synth", segflow::invalid_argument("--spacing: expected X,Y,Z in mm, got '" + t + "'"));
    o.spacing = {x, y, z};
  }
  if (a->has("spacing-jitter")) {
    char* end = nullptr;
    o.spacing_jitter = std::strtod(a->get("spacing-jitter").c_str(), &end);
    if (*end != '\0')
      return fail("synth", segflow::invalid_argument("--spacing-jitter: expected a number, got '" +
                                                     a->get("spacing-jitter") + "'"));
  }
  if (!a->positional.empty())
    return fail("synth", segflow::invalid_argument("unexpected argument '" + a->positional[0] + "'"));
  Status st = segflow::pipeline::synthesize_dataset(o);
  if (!st.is_ok()) return fail("synth", st);
  std::printf("wrote %d %s cases of size %d to %s\n", o.cases, o.format.c_str(), o.size, o.out.c_str());
  return 0;
}

int cmd_inspect(int argc, char** argv) {
  auto a = parse_args(argc, argv, 2, inspect_command().forms.front());
  if (!a.is_ok()) return fail("inspect", a.status());
  if (a->positional.size() != 1)
    return fail("inspect",
                segflow::invalid_argument("expected one PATH, got " + std::to_string(a->positional.size())));
  auto j = segflow::pipeline::inspect_path(a->positional[0]);
  if (!j.is_ok()) return fail("inspect", j.status());
  if (a->flag("json")) {
    std::cout << j->dump() << '\n';
  } else {
    for (auto it = j->begin(); it != j->end(); ++it)
      std::cout << it.key() << ": " << it.value().dump() << '\n';
  }
  return 0;
}

}  // namespace segflow::apps
