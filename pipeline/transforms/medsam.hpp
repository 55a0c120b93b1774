#pragma once
// MedSAM-style box-prompted 2D samples from 3D volumes.

#include "messages/sample.hpp"
#include "messages/status.hpp"
#include "pipeline/fwd.hpp"
#include "pipeline/stage.hpp"

#include <cstdint>
#include <string>

namespace segflow::pipeline {

/// Options of stage "medsam_box". Picks a slice (z) that contains foreground and a label
/// present in it (or `label`), and makes: "image" (3, S, S) float32 (a 1-channel image is
/// repeated), "label" (1, S, S) binary mask of that label (the label's dtype), "box" (4,)
/// float32 x0, y0, x1, y1 (inclusive pixel indices) of the mask grown outward by a random
/// 0..bbox_shift pixels per side, clamped to the image. Other tensors are dropped.
struct MedsamBoxOptions {
  std::string image_key = "image";  ///< (C, Z, Y, X), C = 1 or 3
  std::string label_key = "label";  ///< (1, Z, Y, X) integer label map
  std::int64_t image_size = 256;    ///< output side S, pixels, [16, 4096]
  std::int64_t bbox_shift = 20;     ///< maximum outward jitter per box side, pixels, [0, 4096]
  std::int64_t label = 0;           ///< the label to segment; 0 = a random label present in the slice
  std::int64_t num_samples = 1;     ///< 2-D samples drawn per volume (each its own slice, label, box)
  void bind(OptionParser& p);
};

/// The kernel of medsam_box (see the options). Errors when the label map has no foreground
/// (or not the configured label).
Result<Sample> medsam_box(const Sample& s, const MedsamBoxOptions& o, Rng& rng);

}  // namespace segflow::pipeline
