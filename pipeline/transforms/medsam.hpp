#pragma once
// MedSAM-style box-prompted 2D samples from 3D volumes.

#include "messages/sample.hpp"
#include "messages/status.hpp"
#include "pipeline/fwd.hpp"
#include "pipeline/stage.hpp"

#include <cstdint>
#include <string>

namespace segflow::pipeline {

/// Options of stage "medsam_box". image_size 0 keeps the slice's own rows and columns (then
/// resize_longest_side maps image, mask and box to the model's size, as LiteMedSAM). Picks a slice (z) that
/// contains foreground and a label present in it (or `label`), and makes: "image" (3, S, S) float32 (a
/// 1-channel image is repeated), "label" (1, S, S) binary mask of that label (the label's dtype), "box" (4,)
/// float32 x0, y0, x1, y1 (inclusive pixel indices) of the mask grown outward by a random
/// 0..bbox_shift pixels per side, clamped to the image. Other tensors are dropped.
struct MedsamBoxOptions {
  std::string image_key = "image";  ///< (C, Z, Y, X), C = 1 or 3
  std::string label_key = "label";  ///< (1, Z, Y, X) integer label map
  std::int64_t image_size = 256;    ///< output side S, pixels, [16, 4096]; 0 = the slice's size
  std::int64_t bbox_shift = 20;     ///< maximum outward jitter per box side, pixels, [0, 4096]
  std::int64_t label = 0;           ///< the label to segment; 0 = a random label present in the slice
  std::int64_t num_samples = 1;     ///< 2-D samples drawn per volume (each its own slice, label, box)
  void bind(OptionParser& p);
};

/// The kernel of medsam_box (see the options). Errors when the label map has no foreground
/// (or not the configured label).
Result<Sample> medsam_box(const Sample& s, const MedsamBoxOptions& o, Rng& rng);

// ---- MedSAM's preprocessing (pre_CT_MR.py, LiteMedSAM), stages of medsam_preprocess.cpp ----

/// Options of stage "medsam_normalize": intensities to MedSAM's 0-255 range.
struct MedsamNormalizeOptions {
  std::string key = "image";
  std::string modality = "ct";  ///< ct: window; mr: percentiles of the voxels > 0
  double window_level = 40.0;   ///< CT window centre, HU
  double window_width = 400.0;  ///< CT window width, HU, > 0
  double lower = 0.5;           ///< MR lower percentile, [0, 100]
  double upper = 99.5;          ///< MR upper percentile, [lower, 100]
  bool quantize = true;         ///< truncate to integers 0..255 (MedSAM's np.uint8)
  void bind(OptionParser& p);
};

/// MedSAM's pre_CT_MR.py on one image (all channels together): CT clips to [level - width/2,
/// level + width/2]; MR clips to the lower/upper percentiles (numpy's linear method) of the
/// voxels > 0; then (x - min) / (max - min) * 255 over the clipped image (0 where max == min)
/// and, for MR, 0 where the input was 0; truncated to integers with quantize. float32 out.
at::Tensor medsam_normalize(const at::Tensor& x, const MedsamNormalizeOptions& o);

/// Per slice (x - min) / max(max - min, eps) of a (C, Z, Y, X) tensor (min and max over the
/// slice's channels, as MedSAM on its 3-channel slices) or of a (C, Y, X) image as one slice.
at::Tensor minmax_slices(const at::Tensor& x, double eps);

/// The size LiteMedSAM / SAM's ResizeLongestSide give an (h, w) image whose longest side
/// becomes `size`: (int(h * s + 0.5), int(w * s + 0.5)), s = size / max(h, w).
std::pair<std::int64_t, std::int64_t> longest_side_shape(std::int64_t h, std::int64_t w, std::int64_t size);

/// Resizes the last two axes of a (C, Y, X) or (C, Z, Y, X) tensor to longest_side_shape
/// (bilinear, half-pixel centres, or nearest for labels: source index floor(i * in / out),
/// OpenCV's INTER_NEAREST as LiteMedSAM uses)
/// and, with pad, zero-pads bottom and right to size x size.
at::Tensor resize_longest_side(const at::Tensor& t, std::int64_t size, bool nearest, bool pad);

/// `label` ((1, Z, Y, X) or (1, Y, X), integer) without the connected components, per label
/// value, of fewer than min_size_3d voxels (3D, connectivity_3d) and then, per slice, of
/// fewer than min_size_2d pixels (connectivity_2d): cc3d.dust as MedSAM's pre_CT_MR.py calls
/// it. A size of 0 skips that pass; a (1, Y, X) label gets the 2D pass only.
Result<at::Tensor> remove_small_objects(const at::Tensor& label, std::int64_t min_size_3d,
                                        int connectivity_3d, std::int64_t min_size_2d, int connectivity_2d);

}  // namespace segflow::pipeline
