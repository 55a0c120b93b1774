#pragma once
// The "load" stage: reads a dataset case (pipeline/io/dataset.hpp load_case) into a sample.

#include <string>

#include "messages/sample.hpp"
#include "messages/status.hpp"
#include "pipeline/fwd.hpp"
#include "pipeline/io/dataset.hpp"

namespace segflow::pipeline {

/// Options of stage "load".
struct LoadOptions {
  std::string image_key = "image";    ///< tensor name of the image, (C, Z, Y, X) float32
  std::string label_key = "label";    ///< tensor name of the label map, (1, Z, Y, X)
  std::string label_dtype = "uint8";  ///< uint8 (values 0..255, 8x smaller in the cache) | int64
  bool require_label = false;         ///< error for a case without a label (else no label tensor)
  void bind(OptionParser& p);
};

/// A sample from a loaded case: id, image float32 contiguous, label in `label_dtype`
/// (errors when a value does not fit), geometry of the image.
Result<Sample> sample_from_case(LoadedCase c, const LoadOptions& o);

}  // namespace segflow::pipeline
