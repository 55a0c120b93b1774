#pragma once
// Synthetic CT-like phantoms: the embedded default dataset (`segflow synth`).

#include <array>
#include <cstdint>
#include <filesystem>
#include <string>

#include "messages/status.hpp"
#include "pipeline/fwd.hpp"
#include "pipeline/io/image.hpp"

namespace segflow::pipeline {

/// Options of `segflow synth` and of a job config's `data.synth` section.
struct SynthOptions {
  int cases = 24;                 ///< number of cases, [1, 100000]
  int size = 96;                  ///< in-plane size in voxels (x = y = size), [16, 512]
  std::string format = "nifti";   ///< dicom | nifti | npy
  std::string compress = "none";  ///< DICOM only: none | rle | jpeg-ls | jpeg-lossless
  std::filesystem::path out;      ///< output folder (created); not a data.synth key
  std::uint64_t seed = 0;         ///< dataset seed, >= 0; case i uses (seed, i)
  /// Voxel spacing (x, y, z) in mm, each > 0; all 0 = a random anisotropic spacing per case
  /// (x = y in 0.7..1.6, z in 1.5..3). `segflow synth --spacing` only (not a data.synth key).
  std::array<double, 3> spacing{0.0, 0.0, 0.0};
  /// With `spacing`: each case's spacing varies by a factor 1 + u, u uniform in
  /// [-spacing_jitter, spacing_jitter] (one u for x and y, another for z); [0, 0.9].
  double spacing_jitter = 0.0;
  /// normal | hard. hard: low contrast (organs 8-15 HU apart, noise 25-35 HU), a bias field of
  /// +-70 HU, a thin spleen touching the left kidney, the right kidney touching the liver, and
  /// 0.7 x 0.7 x 5 mm voxels (+-15%) unless `spacing` is given: data on which recipes and
  /// networks separate, where the normal phantoms are learnt by every recipe.
  std::string difficulty = "normal";

  /// Reads cases, size, format, compress, seed and difficulty (pipeline/options.hpp); `out` is the
  /// caller's (a job's data.root).
  void bind(OptionParser& p);
  bool operator==(const SynthOptions&) const = default;
};

/// One phantom: HU image (1, Z, Y, X) float32 with integer values and its label map
/// (1, Z, Y, X) uint8: 0 background/body, 1 liver, 2 spleen, 3 kidneys, 4 spine.
struct Phantom {
  Image image;
  Image label;
};

/// Number of foreground structures in every phantom (labels 1..kPhantomLabels).
inline constexpr int kPhantomLabels = 4;
/// Names of labels 0..kPhantomLabels.
const char* phantom_label_name(int label);

/// Makes case `index` of a dataset seeded with `seed`: random anisotropic spacing (or
/// `spacing` (x, y, z) mm with its jitter, see SynthOptions), an oblique orientation on every
/// third case, Gaussian noise and a smooth bias field; `hard`: SynthOptions::difficulty hard.
Phantom make_phantom(int size, std::uint64_t seed, int index,
                     const std::array<double, 3>& spacing = {0, 0, 0}, double spacing_jitter = 0.0,
                     bool hard = false);

/// Writes a whole dataset in the layout of its format (MSD for nifti, DICOM case folders
/// with a DICOM SEG for dicom, MedSAM imgs/ gts/ for npy). Validates options first.
Status synthesize_dataset(const SynthOptions& options);

}  // namespace segflow::pipeline
