#pragma once
// Intensity transforms: tensor kernels and the options of their stages. Kernels take and
// return floating tensors (integer input is converted to float32 by the deterministic ones;
// random ones require floating input) on the input's device.

#include <ATen/core/Tensor.h>

#include <array>
#include <string>
#include <vector>

#include "pipeline/fwd.hpp"

namespace segflow::pipeline {

/// Options of stage "scale_intensity_range" (MONAI ScaleIntensityRange; a CT window).
struct ScaleIntensityRangeOptions {
  std::vector<std::string> keys{"image"};  ///< tensors to scale
  bool allow_missing_keys = false;         ///< skip keys a sample lacks (e.g. no label at inference)
  double a_min = -1000.0;                  ///< input value mapped to b_min (HU for CT)
  double a_max = 1000.0;                   ///< input value mapped to b_max, != a_min
  double b_min = 0.0;                      ///< output for a_min
  double b_max = 1.0;                      ///< output for a_max
  bool clip = true;                        ///< clamp the output to [b_min, b_max]
  void bind(OptionParser& p);
};

/// (x - a_min) / (a_max - a_min) * (b_max - b_min) + b_min, optionally clipped; float32 out.
at::Tensor scale_intensity_range(const at::Tensor& x, double a_min, double a_max, double b_min, double b_max,
                                 bool clip);

/// Options of stage "normalize_intensity" (z-score; MONAI NormalizeIntensity).
struct NormalizeIntensityOptions {
  std::vector<std::string> keys{"image"};  ///< tensors to normalise
  bool allow_missing_keys = false;         ///< skip keys a sample lacks (e.g. no label at inference)
  bool nonzero = false;                    ///< statistics over non-zero voxels only; zero voxels stay 0
  bool channel_wise = true;                ///< one mean/std per channel (else one over all channels)
  std::string mask_key;                    ///< when set: statistics over mask > 0 only; outside set to 0
  void bind(OptionParser& p);
};

/// (x - mean) / std over the selected voxels (std = 1 when it is 0; population std).
/// `mask` (C or 1 channels, same spatial shape) may be undefined; `nonzero` adds x != 0.
/// Voxels outside the selection are set to 0.
at::Tensor normalize_intensity(const at::Tensor& x, const at::Tensor& mask, bool nonzero, bool channel_wise);

/// Options of stage "rand_shift_intensity".
struct RandShiftIntensityOptions {
  std::vector<std::string> keys{"image"};  ///< tensors to shift (floating)
  bool allow_missing_keys = false;         ///< skip keys a sample lacks (e.g. no label at inference)
  double prob = 0.1;                       ///< chance of shifting, [0, 1]
  double offsets = 0.1;                    ///< offset uniform in [-offsets, offsets], intensity units, >= 0
  void bind(OptionParser& p);
};

/// Options of stage "rand_scale_intensity".
struct RandScaleIntensityOptions {
  std::vector<std::string> keys{"image"};  ///< tensors to scale (floating)
  bool allow_missing_keys = false;         ///< skip keys a sample lacks (e.g. no label at inference)
  double prob = 0.1;                       ///< chance of scaling, [0, 1]
  double factors = 0.1;                    ///< x * (1 + f), f uniform in [-factors, factors], >= 0
  void bind(OptionParser& p);
};

/// Options of stage "rand_gamma" (MONAI RandAdjustContrast).
struct RandGammaOptions {
  std::vector<std::string> keys{"image"};  ///< tensors to adjust (floating)
  bool allow_missing_keys = false;         ///< skip keys a sample lacks (e.g. no label at inference)
  double prob = 0.1;                       ///< chance of adjusting, [0, 1]
  std::array<double, 2> gamma{0.5, 4.5};   ///< gamma uniform in [lo, hi], > 0
  void bind(OptionParser& p);
};

/// ((x - min) / (max - min + eps))^gamma * (max - min) + min, min/max over the tensor.
at::Tensor adjust_gamma(const at::Tensor& x, double gamma);

/// Options of stage "rand_gaussian_noise".
struct RandGaussianNoiseOptions {
  std::vector<std::string> keys{"image"};  ///< tensors to add noise to (floating)
  bool allow_missing_keys = false;         ///< skip keys a sample lacks (e.g. no label at inference)
  double prob = 0.1;                       ///< chance of adding noise, [0, 1]
  double mean = 0.0;                       ///< noise mean, intensity units
  double std = 0.1;                        ///< noise standard deviation (the maximum when sample_std), >= 0
  bool sample_std = true;                  ///< draw the std uniformly in [0, std] per sample
  void bind(OptionParser& p);
};

}  // namespace segflow::pipeline
