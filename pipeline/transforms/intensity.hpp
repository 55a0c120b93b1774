#pragma once
// Intensity transforms: tensor kernels and the options of their stages. Kernels take and
// return floating tensors (integer input is converted to float32 by the deterministic ones;
// random ones require floating input) on the input's device.

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "messages/status.hpp"
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

/// How a random factor in [lo, hi] is drawn (option `sampling` of the factor stages).
enum class FactorSampling {
  uniform,  ///< uniform in [lo, hi]
  halves,   ///< nnU-Net's BGContrast: with chance 1/2 uniform in [lo, 1), else in [max(lo, 1), hi]
};
/// "uniform" | "halves".
const char* to_string(FactorSampling s);

/// Options of stage "rand_gamma" (MONAI RandAdjustContrast; with invert_prob and
/// retain_stats nnU-Net's GammaTransform).
struct RandGammaOptions {
  std::vector<std::string> keys{"image"};  ///< tensors to adjust (floating)
  bool allow_missing_keys = false;         ///< skip keys a sample lacks (e.g. no label at inference)
  double prob = 0.1;                       ///< chance of adjusting, [0, 1]
  std::array<double, 2> gamma{0.5, 4.5};   ///< gamma in [lo, hi], > 0
  FactorSampling sampling = FactorSampling::uniform;  ///< how gamma is drawn in [lo, hi]
  double invert_prob = 0.0;   ///< chance of applying to -x (invert, gamma, invert back), [0, 1]
  bool retain_stats = false;  ///< restore the mean and std the tensor (channel) had before
  bool channel_wise = false;  ///< own gamma, inversion and min/max per channel (else one per tensor)
  void bind(OptionParser& p);
};

/// ((x - min) / (max - min + eps))^gamma * (max - min) + min, min/max over the tensor.
at::Tensor adjust_gamma(const at::Tensor& x, double gamma);
/// adjust_gamma with nnU-Net's GammaTransform extras: `invert` applies it to -x and negates
/// the result; `retain_stats` then shifts and scales it back to the mean and std (unbiased,
/// divided by max(std after, 1e-7)) that x (or -x) had.
at::Tensor adjust_gamma(const at::Tensor& x, double gamma, bool invert, bool retain_stats);

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

// ---- nnU-Net's normalisations and augmentations (nnUNetTrainer, batchgeneratorsv2) ----

/// Options of stage "normalize_ct" (nnU-Net's CTNormalization): clip to [lower, upper], then
/// (x - mean) / max(std, 1e-8), with the dataset's foreground statistics (the fingerprint's
/// percentiles 0.5 and 99.5, mean and std). Each is one number (every channel) or a list of
/// one per channel. The defaults are placeholders that only clip to the 12-bit CT range: a
/// plan gives the fingerprint's figures.
struct NormalizeCtOptions {
  std::vector<std::string> keys{"image"};  ///< tensors to normalise
  bool allow_missing_keys = false;         ///< skip keys a sample lacks (e.g. no label at inference)
  std::vector<double> lower{-1024.0};      ///< clip below, input units (HU); <= upper
  std::vector<double> upper{3071.0};       ///< clip above, input units (HU)
  std::vector<double> mean{0.0};           ///< subtracted after clipping, input units
  std::vector<double> stddev{1.0};         ///< option `std`: divisor (at least 1e-8), input units, >= 0
  void bind(OptionParser& p);
};

/// nnU-Net's CTNormalization of a (C, ...) tensor, in float32 (float64 stays float64).
/// Each vector holds 1 value (every channel) or C. Errors (invalid_argument) on other sizes.
Result<at::Tensor> normalize_ct(const at::Tensor& x, const std::vector<double>& lower,
                                const std::vector<double>& upper, const std::vector<double>& mean,
                                const std::vector<double>& stddev);

/// Options of stage "zscore" (nnU-Net's ZScoreNormalization).
struct ZScoreOptions {
  std::vector<std::string> keys{"image"};  ///< tensors to normalise
  bool allow_missing_keys = false;         ///< skip keys a sample lacks (e.g. no label at inference)
  /// statistics over nonzero_region(x) only (nnU-Net's use_mask_for_norm); voxels outside
  /// it (zero in every channel) stay 0
  bool nonzero = false;
  void bind(OptionParser& p);
};

/// Per channel (x - mean) / max(std, 1e-8), population std, statistics in float64; over
/// nonzero_region(x) when `nonzero` (voxels outside keep their value, 0). Float32 out for
/// integer input.
at::Tensor zscore(const at::Tensor& x, bool nonzero);

/// nnU-Net's create_nonzero_mask of a (C, ...) tensor: voxels where any channel is non-zero,
/// with holes filled as scipy.ndimage.binary_fill_holes does (background not connected to
/// the border through faces). Bool (...) on x's device; the filling runs on the host.
at::Tensor nonzero_region(const at::Tensor& x);

/// Options of stage "clip_percentiles": per image and channel, clip to its own percentiles.
struct ClipPercentilesOptions {
  std::vector<std::string> keys{"image"};  ///< tensors to clip
  bool allow_missing_keys = false;         ///< skip keys a sample lacks (e.g. no label at inference)
  double lower = 0.5;                      ///< lower percentile, [0, 100], <= upper
  double upper = 99.5;                     ///< upper percentile, [0, 100]
  bool nonzero = false;  ///< percentiles of the non-zero voxels of the channel; zero voxels stay 0
  bool rescale = false;  ///< then map [lower value, upper value] linearly to [b_min, b_max]
  double b_min = 0.0;    ///< output of the lower percentile value (with rescale)
  double b_max = 1.0;    ///< output of the upper percentile value (with rescale)
  void bind(OptionParser& p);
};

/// The q-th percentile (q in [0, 100]) of the values of `x`, linear interpolation between
/// closest ranks (numpy.percentile's default), in float64; NaN for an empty x.
double percentile(const at::Tensor& x, double q);

/// clip_percentiles of a (C, ...) tensor (see ClipPercentilesOptions); float32 out for
/// integer input.
at::Tensor clip_percentiles(const at::Tensor& x, double lower, double upper, bool nonzero, bool rescale,
                            double b_min, double b_max);

/// Options of stage "rand_gaussian_blur" (nnU-Net's GaussianBlurTransform).
struct RandGaussianBlurOptions {
  std::vector<std::string> keys{"image"};  ///< tensors to blur (floating)
  bool allow_missing_keys = false;         ///< skip keys a sample lacks (e.g. no label at inference)
  double prob = 0.2;                       ///< chance per sample, [0, 1]
  double prob_per_channel = 0.5;           ///< then chance per channel, [0, 1]
  std::array<double, 2> sigma{0.5, 1.0};   ///< sigma uniform in [lo, hi], voxels, >= 0
  bool per_axis = true;                    ///< own sigma per spatial axis (else one for all)
  double truncate = 4.0;                   ///< kernel radius int(truncate * sigma + 0.5), > 0
  void bind(OptionParser& p);
};

/// Separable Gaussian filter of a (C, ...) tensor as scipy.ndimage.gaussian_filter(mode=
/// "reflect", truncate): `sigma` per spatial dim in tensor order (z, y, x), voxels, 0 = none.
/// Kernel computed in float64, convolution in x's floating type.
at::Tensor gaussian_blur(const at::Tensor& x, const std::vector<double>& sigma, double truncate);

/// Options of stage "rand_brightness" (nnU-Net's MultiplicativeBrightnessTransform).
struct RandBrightnessOptions {
  std::vector<std::string> keys{"image"};        ///< tensors to scale (floating)
  bool allow_missing_keys = false;               ///< skip keys a sample lacks (e.g. no label at inference)
  double prob = 0.15;                            ///< chance per sample, [0, 1]
  double prob_per_channel = 1.0;                 ///< then chance per channel, [0, 1]
  std::array<double, 2> multiplier{0.75, 1.25};  ///< x * m, m in [lo, hi] per channel, >= 0
  FactorSampling sampling = FactorSampling::halves;  ///< how m is drawn
  void bind(OptionParser& p);
};

/// Options of stage "rand_contrast" (nnU-Net's ContrastTransform).
struct RandContrastOptions {
  std::vector<std::string> keys{"image"};    ///< tensors to adjust (floating)
  bool allow_missing_keys = false;           ///< skip keys a sample lacks (e.g. no label at inference)
  double prob = 0.15;                        ///< chance per sample, [0, 1]
  double prob_per_channel = 1.0;             ///< then chance per channel, [0, 1]
  std::array<double, 2> factor{0.75, 1.25};  ///< (x - mean) * f + mean, f in [lo, hi], >= 0
  FactorSampling sampling = FactorSampling::halves;  ///< how f is drawn
  bool preserve_range = true;                        ///< clip to the channel's min and max before
  void bind(OptionParser& p);
};

/// (x - mean) * factor + mean over the whole of `x` (one channel), clipped to x's [min, max]
/// when `preserve_range`.
at::Tensor adjust_contrast(const at::Tensor& x, double factor, bool preserve_range);

/// Options of stage "rand_simulate_low_resolution" (nnU-Net's SimulateLowResolutionTransform).
struct RandSimulateLowResolutionOptions {
  std::vector<std::string> keys{"image"};  ///< tensors to degrade (floating)
  bool allow_missing_keys = false;         ///< skip keys a sample lacks (e.g. no label at inference)
  double prob = 0.25;                      ///< chance per sample, [0, 1]
  double prob_per_channel = 0.5;           ///< then chance per channel, [0, 1]
  std::array<double, 2> zoom{0.5, 1.0};    ///< zoom uniform in [lo, hi], (0, 1]
  bool per_axis = false;                   ///< own zoom per spatial axis (else one for all)
  std::vector<std::int64_t> ignore_axes;   ///< axes kept at full resolution (0 = x, 1 = y, 2 = z)
  void bind(OptionParser& p);
};

/// Downsamples a (C, ...) tensor to round(n * zoom) voxels per spatial dim (half to even, at
/// least 1; nearest-exact) and upsamples it back (bilinear/trilinear, align_corners false),
/// as batchgeneratorsv2. `zoom` per spatial dim in tensor order; 1 leaves a dim alone.
at::Tensor simulate_low_resolution(const at::Tensor& x, const std::vector<double>& zoom);

}  // namespace segflow::pipeline
