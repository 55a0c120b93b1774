#pragma once
// Checkpoints: the file format, Trainer::save_checkpoint / load_checkpoint (defined in
// checkpoint.cpp) and load_for_inference. To change the format, edit checkpoint.cpp.
//
// A checkpoint is a LibTorch archive (torch::serialize) with these records:
// clang-format off
//   model            the module's parameters and buffers (torch::nn::Module::save)
//   optimizer_state  FusedOptimizer::state() by name (format 1: "optimizer", torch::optim's own)
//   meta             a JSON object as uint8 bytes: format ("segflow-checkpoint-2"), epoch, step,
//                    best_metric, best_epoch, optimizer, loss_scale, good_steps, skipped_steps,
//                    num_classes, saved_on (device), early_stop (train.early_stopping's state:
//                    metric, mode, best, best_epoch, validations_without_improvement; absent
//                    in older checkpoints = a fresh count), config (the resolved job config),
//                    class_names (the names of classes 0..K-1, background first, written at
//                    training time; absent when the classes had no names or in older files)
//   rng_cpu          the CPU generator's state
//   rng_cuda         the CUDA generator's state (written on CUDA, read back on CUDA only)
// clang-format on
// Written to a temporary file and renamed; read onto the CPU whatever device wrote it.
// A run folder holds last.pt (every train.checkpoint_interval epochs and at the end) and
// best.pt (at each new best validation Dice).

#include <nlohmann/json.hpp>

#include <filesystem>
#include <memory>
#include <string>

#include "messages/status.hpp"
#include "models/fwd.hpp"

namespace segflow::models {

/// File names of a run folder's checkpoints.
inline constexpr const char* kLastCheckpoint = "last.pt";
inline constexpr const char* kBestCheckpoint = "best.pt";

/// The `meta` record of a checkpoint (above), without loading its tensors into a model.
/// Errors name the file.
Result<nlohmann::json> read_checkpoint_meta(const std::filesystem::path& checkpoint);

/// A model with its config, restored from a checkpoint for inference: the trainer its
/// `config` record describes (pretrained weights not loaded; fp16 off on a CPU), on `device`
/// ("auto", "cpu", "cuda:N"), with the checkpoint loaded into it; with `channels_last` its
/// convolution weights in channels-last layout (inputs then follow, predict_probabilities).
Result<std::unique_ptr<Trainer>> load_for_inference(const std::filesystem::path& checkpoint,
                                                    const std::string& device = "auto",
                                                    bool channels_last = false);

}  // namespace segflow::models
