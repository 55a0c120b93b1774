#pragma once
// `segflow export --to onnx`: a trained UNet or PlainConvUNet as an ONNX graph written from
// C++ (the torch-free writer in models/interop/onnx/ checks it with the ONNX checker and strict shape
// inference), with a JSON manifest of what a runtime needs to reproduce `segflow infer`.
//
// The graph is the network in evaluation mode: convolutions (Conv / ConvTranspose with
// segflow's padding, strides and output padding), instance norm (InstanceNormalization),
// batch norm with its running statistics (BatchNormalization), ReLU / PReLU / LeakyReLU /
// GELU (as Erf, which opset 17 has), dropout dropped, skips as Concat and residuals as Add. A
// PlainConvUNet's deep-supervision heads are dropped: the one output is the full-resolution
// logits. Input "image" (N, C, [Z,] Y, X) and output "logits" (N, K, [Z,] Y, X) with
// symbolic batch and spatial axes; every spatial size must be a multiple of the manifest's
// size_divisors (as segflow's own forward). Initializers keep segflow's parameter names.
// A box-prompted SAM becomes two graphs (write_sam_onnx, models/interop/onnx_export_sam.cpp): the
// image encoder and the prompt encoder + mask decoder, at the model's fixed image size.

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "messages/status.hpp"
#include "models/fwd.hpp"

namespace segflow::models {

class SamImpl;

struct OnnxExportOptions {
  int opset = 17;             ///< 13..17 (what the ONNX library checks)
  bool fp16_weights = false;  ///< store weights as float16 (cast to float32 in the graph)
  /// The model's class names for the manifest (model_class_names); empty = from the job config.
  std::vector<std::string> class_names;
};

/// Writes `module` (built from `options`, in evaluation mode) to `out` as ONNX: checked,
/// through a temporary and a rename (a SAM: the two files of onnx_output_files). The checker's
/// message for a graph it refuses; nothing left at `out` on error.
Status write_onnx_model(const ModelOptions& options, const torch::nn::Module& module,
                        const std::filesystem::path& out, const OnnxExportOptions& export_options);

/// The preprocessing manifest of a trained job (written beside the .onnx as
/// "<name>.manifest.json"): the input/output tensor layout, the size divisors, the class
/// names, the deterministic stages of the training pipeline with their resolved options (what
/// `segflow infer` runs before the network) and a summary of them (orientation, target
/// spacing, intensity normalisation), the sliding window (roi_size, overlap, blending mode,
/// Gaussian sigma scale, padding), the probability activation and the mirroring axes.
Result<nlohmann::json> onnx_manifest(const JobConfig& config, const ModelInfo& info,
                                     const std::filesystem::path& onnx_file,
                                     const OnnxExportOptions& export_options);

/// The files write_onnx_model writes for `out` (".onnx"): `out`, or for a SAM
/// "<stem>.encoder.onnx" and "<stem>.decoder.onnx" beside it.
std::vector<std::filesystem::path> onnx_output_files(const ModelOptions& options,
                                                     const std::filesystem::path& out);

/// The SAM files of `out`: {"<stem>.encoder.onnx", "<stem>.decoder.onnx"}.
std::vector<std::filesystem::path> sam_onnx_files(const std::filesystem::path& out);

/// A SAM as two checked ONNX graphs at its fixed image size S (patch p, e = S / p, D =
/// out_chans): the image encoder, input "image" (batch, in_chans, S, S) -> "image_embeddings"
/// (batch, D, e, e); the prompt encoder + mask decoder, inputs "image_embeddings" and "boxes"
/// (batch, 4: x0, y0, x1, y1 in model-input pixels) -> "low_res_masks" (batch, 1, 4e, 4e) and,
/// with the IoU head, "iou_predictions" (batch, 1). Relative-position tables and the grid's
/// positional encoding are folded into constants; LayerNorm is decomposed below opset 17.
/// Both files or neither.
Status write_sam_onnx(const SamImpl& sam, const std::filesystem::path& out, const OnnxExportOptions& eo);

/// The manifest of a SAM export: the two files and their tensors, the deterministic stages box
/// inference runs before medsam_box, the slice resize, the box frame, the mask upsampling and
/// threshold (what `segflow infer --boxes` does around the network).
Result<nlohmann::json> sam_onnx_manifest(const JobConfig& config, const ModelInfo& info,
                                         const std::filesystem::path& onnx_file,
                                         const OnnxExportOptions& export_options);

}  // namespace segflow::models
