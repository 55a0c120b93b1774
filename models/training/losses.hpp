#pragma once
// Segmentation losses with MONAI's semantics (monai.losses): DiceLoss, cross entropy /
// BCE-with-logits, DiceCELoss, Dice + BCE, FocalLoss, DiceFocalLoss; and nnU-Net's deep
// supervision wrapper.
//
// Shapes: input logits (N, C, *spatial). Target either an integer label map (N, 1, *spatial)
// (one-hot encoded to C channels when to_onehot_y is set, used directly by cross entropy) or
// a float tensor shaped like the input (one-hot or binary).
//
// Empty classes: a class absent from both prediction and target has intersection 0 and
// denominator 0, so its Dice loss is 1 - smooth_nr / smooth_dr = 0 with the defaults
// (smooth_nr = smooth_dr = 1e-5): no NaN, and a perfect "nothing predicted, nothing there"
// scores as no loss. Setting smooth_dr to 0 brings the NaN back; validate() refuses it.

#include <ATen/core/Tensor.h>
#include <nlohmann/json_fwd.hpp>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "messages/status.hpp"
#include "pipeline/fwd.hpp"

namespace segflow::models {

/// How logits become probabilities before the Dice (and focal) terms.
enum class LossActivation { none, softmax, sigmoid };
/// How per-class / per-sample terms are reduced.
enum class LossReduction { mean, sum, none };

/// MONAI DiceLoss options (MONAI's defaults except `act`, which replaces the booleans
/// sigmoid / softmax).
struct DiceLossOptions {
  LossActivation act = LossActivation::softmax;  ///< softmax needs C >= 2 (else an error)
  bool include_background = true;                ///< keep channel 0 (dropped only when C >= 2)
  bool to_onehot_y = true;    ///< target is a label map (N, 1, ...): one-hot to C channels (C >= 2)
  bool squared_pred = false;  ///< squares in the denominator (V-Net)
  bool jaccard = false;       ///< Jaccard (IoU) form instead of Dice
  double smooth_nr = 1e-5;    ///< added to the numerator, >= 0
  double smooth_dr = 1e-5;    ///< added to the denominator, > 0
  bool batch = false;         ///< sum over the batch before the ratio (one score per class)
  LossReduction reduction = LossReduction::mean;  ///< none: (N, C') or, with batch, (C')

  Status validate() const;
};

/// 1 - (2 sum(p t) + smooth_nr) / (sum(p) + sum(t) + smooth_dr) per sample and class.
at::Tensor dice_loss(const at::Tensor& input, const at::Tensor& target, const DiceLossOptions& options = {});

/// Cross entropy on logits (N, C, ...) with a label map (N, 1, ...) / (N, ...) or soft float
/// targets (N, C, ...); class_weights (C) weight each voxel by its true class and the mean
/// divides by the summed weights (torch.nn.CrossEntropyLoss). Mean over voxels.
at::Tensor ce_loss(const at::Tensor& input, const at::Tensor& target,
                   const std::vector<double>& class_weights = {});
/// The same with the class weights as a tensor (C) already on the input's device, or
/// undefined for none: a training loss makes it once (ClassWeights), not every step.
at::Tensor ce_loss(const at::Tensor& input, const at::Tensor& target, const at::Tensor& class_weights);

/// Mean binary cross entropy with logits; target is converted to the input's dtype.
at::Tensor bce_with_logits_loss(const at::Tensor& input, const at::Tensor& target);

/// MONAI FocalLoss on logits: sigmoid form (1 - p_t)^gamma * BCE, or softmax form
/// -(1 - p)^gamma t log p; optional alpha balances positives (alpha) against negatives.
/// Target float like the input (or a label map with to_onehot_y). Mean over all elements.
struct FocalLossOptions {
  double gamma = 2.0;           ///< focusing exponent, >= 0
  std::optional<double> alpha;  ///< in [0, 1]; none = no balancing
  bool use_softmax = false;     ///< softmax focal loss instead of sigmoid
  bool include_background = true;
  bool to_onehot_y = false;
};
at::Tensor focal_loss(const at::Tensor& input, const at::Tensor& target,
                      const FocalLossOptions& options = {});

/// The losses make_loss can build: each has one entry (name, description, default
/// activation, factory) in the table of losses.cpp.
enum class LossKind { dice, ce, bce, dice_ce, dice_bce, focal, dice_focal };
/// The loss's name in a job config ("dice_ce").
const char* to_string(LossKind kind);

/// How the outputs of a deep-supervised model (full resolution first) are weighted:
///   halving  1/2^i for output i, normalised to sum 1 (segflow's default so far)
///   nnunet   as halving but the lowest-resolution output weighs 0 before normalising, as
///            nnU-Net v2's trainer does (e.g. 4 outputs: 8/14, 4/14, 2/14, 0)
///   none     the full-resolution output alone (weights 1, 0, 0, ...)
enum class DeepSupervisionWeights { halving, nnunet, none };
/// "halving", "nnunet", "none".
const char* to_string(DeepSupervisionWeights weights);

/// One loss by name with every knob (parsed from a job config by parse_loss_options).
struct LossOptions {
  LossKind kind = LossKind::dice_ce;
  DiceLossOptions dice;           ///< Dice term (and activation / one-hot of the focal term)
  std::vector<double> ce_weight;  ///< class weights of the cross entropy term (empty: none)
  double lambda_dice = 1.0;       ///< weight of the Dice term, >= 0
  double lambda_ce = 1.0;         ///< weight of the CE / BCE term, >= 0
  double lambda_focal = 1.0;      ///< weight of the focal term, >= 0
  double gamma = 2.0;             ///< focal exponent
  std::optional<double> alpha;    ///< focal alpha
  bool focal_softmax = false;     ///< softmax focal term (MONAI FocalLoss use_softmax)
  /// Weights of a deep-supervised model's outputs (plain_unet with deep_supervision); no
  /// effect on a model with one output.
  DeepSupervisionWeights deep_supervision = DeepSupervisionWeights::halving;
  /// Weight of the IoU-prediction term of a box-prompted model with an IoU head (LiteMedSAM's
  /// iou_loss_weight; see iou_prediction_loss), added to the loss above; 0 = off. Key
  /// `iou_weight`, only in the resolved config when given (run folder names unchanged).
  double iou_weight = 0.0;

  Status validate() const;
  /// Reads a job config's `loss` section (keys in parse_loss_options), then validate().
  void bind(pipeline::OptionParser& p);
};

/// Every option, defaults included (what a run folder's config.json holds).
void to_json(nlohmann::json& j, const LossOptions& options);

/// A loss: (logits, target) -> scalar (or per-element with reduction none for dice).
using LossFn = std::function<at::Tensor(const at::Tensor& input, const at::Tensor& target)>;

/// LiteMedSAM's IoU loss: mean over the batch of (iou_pred - IoU)^2, where IoU is the true
/// IoU of the predicted mask (logit > 0, i.e. sigmoid > 0.5) with target > 0 per sample; no
/// gradient flows through the IoU itself. mask_logits (B, 1, H, W), iou_pred (B, 1), target
/// (B, 1, H, W). A sample whose mask and target are both empty has IoU 1 (LiteMedSAM's
/// cal_iou gives NaN there).
at::Tensor iou_prediction_loss(const at::Tensor& mask_logits, const at::Tensor& iou_pred,
                               const at::Tensor& target);

/// Builds the loss. dice_ce: lambda_dice Dice + lambda_ce CE (BCE when C == 1, as MONAI);
/// dice_bce: Dice (use act sigmoid) + BCE-with-logits on every channel; dice_focal: Dice +
/// focal, the focal term sigmoid unless focal_softmax (as MONAI's DiceFocalLoss, whose focal
/// term is sigmoid-based whatever the Dice activation).
Result<LossFn> make_loss(const LossOptions& options);

/// Parses {"name": "dice_ce", "softmax": true, "to_onehot_y": true, "include_background":
/// false, "squared_pred": false, "jaccard": false, "smooth_nr": 1e-5, "smooth_dr": 1e-5,
/// "batch": false, "sigmoid": false, "ce_weight": [..], "lambda_dice": 1, "lambda_ce": 1,
/// "lambda_focal": 1, "gamma": 2, "alpha": null, "focal_softmax": false, "deep_supervision":
/// "halving"}. Unknown keys and bad values are
/// errors naming `where` and the key ("loss.smoth_nr: unknown option; expected name, ...").
/// "softmax"/"sigmoid" pick act (at most one true; neither = none); a given name brings its
/// default (sigmoid for bce and dice_bce, softmax otherwise).
Result<LossOptions> parse_loss_options(const nlohmann::json& j, const std::string& where = "loss");
/// Names accepted by parse_loss_options' "name", in the table's order.
std::vector<std::string> loss_names();

/// nnU-Net deep supervision: outputs[i] (full resolution first) are scored against the target
/// downsampled to their size ("nearest-exact", as nnU-Net v2; per axis, so anisotropic
/// strides work) and summed with the weights of `kind` (halving: 1 / 2^i normalised to 1;
/// nnunet: the lowest resolution's weight 0 before normalising, as nnU-Net's trainer does;
/// none: the first output alone). Outputs of weight 0 are not scored.
class DeepSupervisionLoss {
 public:
  explicit DeepSupervisionLoss(LossFn loss, DeepSupervisionWeights kind = DeepSupervisionWeights::halving);
  /// zero_lowest: nnunet, else halving.
  DeepSupervisionLoss(LossFn loss, bool zero_lowest);
  /// outputs non-empty, each (N, C, *spatial_i); target (N, 1 or C, *spatial_0).
  at::Tensor operator()(const std::vector<at::Tensor>& outputs, const at::Tensor& target) const;
  /// The normalised weights for n outputs.
  static std::vector<double> weights(size_t n, DeepSupervisionWeights kind);
  /// zero_lowest: nnunet, else halving.
  static std::vector<double> weights(size_t n, bool zero_lowest = false);
  /// Target resized to `spatial` by nearest-exact (dtype kept).
  static at::Tensor downsample_target(const at::Tensor& target, at::IntArrayRef spatial);

 private:
  LossFn loss_;
  DeepSupervisionWeights kind_;
};

}  // namespace segflow::models
