#include "models/training/losses.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <memory>
#include <mutex>

#include "pipeline/options.hpp"

namespace segflow::models {
namespace F = torch::nn::functional;
namespace {

// Label map (N, 1, ...) -> one-hot float (N, C, ...).
at::Tensor one_hot(const at::Tensor& labels, int64_t num_classes, at::ScalarType dtype) {
  TORCH_CHECK(labels.dim() >= 2 && labels.size(1) == 1,
              "one-hot: expected a label map (N, 1, *spatial), got shape ", labels.sizes());
  auto shape = labels.sizes().vec();
  shape[1] = num_classes;
  auto out = torch::zeros(shape, labels.options().dtype(dtype));
  return out.scatter_(1, labels.to(torch::kLong), 1.0);
}

at::Tensor activate(const at::Tensor& input, LossActivation act) {
  switch (act) {
    case LossActivation::softmax:
      TORCH_CHECK(input.size(1) >= 2, "dice loss: softmax needs at least 2 channels, got shape ",
                  input.sizes(), " (use sigmoid for a single channel)");
      return torch::softmax(input, 1);
    case LossActivation::sigmoid:
      return torch::sigmoid(input);
    case LossActivation::none:
      return input;
  }
  return input;
}

// Target as float (N, C, ...): one-hot a label map when asked (and C >= 2), else convert.
at::Tensor prepare_target(const at::Tensor& input, const at::Tensor& target, bool to_onehot_y) {
  TORCH_CHECK(target.dim() == input.dim(),
              "loss: target must have the input's number of dims (N, C, *spatial); input ", input.sizes(),
              ", target ", target.sizes());
  at::Tensor t = target;
  if (to_onehot_y && input.size(1) > 1)
    t = one_hot(target, input.size(1), input.scalar_type());
  else
    t = target.to(input.scalar_type());
  TORCH_CHECK(t.sizes() == input.sizes(), "loss: target shape ", t.sizes(), " does not match input shape ",
              input.sizes(), to_onehot_y ? "" : " (a label map needs to_onehot_y)");
  return t;
}

at::Tensor reduce(const at::Tensor& f, LossReduction r) {
  switch (r) {
    case LossReduction::mean:
      return f.mean();
    case LossReduction::sum:
      return f.sum();
    case LossReduction::none:
      return f;
  }
  return f;
}

}  // namespace

Status DiceLossOptions::validate() const {
  if (!(smooth_nr >= 0))
    return invalid_argument("loss: smooth_nr: expected >= 0, got " + std::to_string(smooth_nr));
  if (!(smooth_dr > 0))
    return invalid_argument("loss: smooth_dr: expected > 0 (0 gives NaN for empty classes), got " +
                            std::to_string(smooth_dr));
  return Status::ok();
}

at::Tensor dice_loss(const at::Tensor& input_logits, const at::Tensor& target_in, const DiceLossOptions& o) {
  TORCH_CHECK(input_logits.dim() >= 3, "dice loss: expected input (N, C, *spatial), got shape ",
              input_logits.sizes());
  auto input = activate(input_logits, o.act);
  auto target = prepare_target(input, target_in, o.to_onehot_y);
  if (!o.include_background && input.size(1) > 1) {
    using torch::indexing::Slice;
    input = input.index({Slice(), Slice(1)});
    target = target.index({Slice(), Slice(1)});
  }
  std::vector<int64_t> axes;
  if (o.batch) axes.push_back(0);
  for (int64_t d = 2; d < input.dim(); ++d) axes.push_back(d);
  auto intersection = (target * input).sum(axes);
  auto ground_o = o.squared_pred ? (target * target).sum(axes) : target.sum(axes);
  auto pred_o = o.squared_pred ? (input * input).sum(axes) : input.sum(axes);
  auto denominator = ground_o + pred_o;
  if (o.jaccard) denominator = 2.0 * (denominator - intersection);
  auto f = 1.0 - (2.0 * intersection + o.smooth_nr) / (denominator + o.smooth_dr);
  return reduce(f, o.reduction);
}

at::Tensor ce_loss(const at::Tensor& input, const at::Tensor& target, const at::Tensor& w) {
  TORCH_CHECK(input.dim() >= 2, "cross entropy: expected input (N, C, ...), got shape ", input.sizes());
  auto opts = F::CrossEntropyFuncOptions().reduction(torch::kMean);
  if (w.defined()) {
    TORCH_CHECK(w.numel() == input.size(1), "cross entropy: ", w.numel(), " class weights for ",
                input.size(1), " classes");
    opts =
        opts.weight(w.device() == input.device() && w.dtype() == input.dtype() ? w : w.to(input.options()));
  }
  at::Tensor t = target;
  if (t.dim() == input.dim() && t.size(1) == 1 && input.size(1) != 1) {
    t = t.squeeze(1).to(torch::kLong);  // label map
  } else if (t.dim() == input.dim() - 1) {
    t = t.to(torch::kLong);
  } else {
    t = t.to(input.scalar_type());  // class probabilities
  }
  return F::cross_entropy(input, t, opts);
}

at::Tensor ce_loss(const at::Tensor& input, const at::Tensor& target, const std::vector<double>& w) {
  return ce_loss(input, target, w.empty() ? at::Tensor() : torch::tensor(w, input.options()));
}

at::Tensor bce_with_logits_loss(const at::Tensor& input, const at::Tensor& target) {
  TORCH_CHECK(target.sizes() == input.sizes(), "bce: target shape ", target.sizes(),
              " does not match input shape ", input.sizes());
  return F::binary_cross_entropy_with_logits(input, target.to(input.scalar_type()));
}

at::Tensor focal_loss(const at::Tensor& input, const at::Tensor& target_in, const FocalLossOptions& o) {
  auto target = prepare_target(input, target_in, o.to_onehot_y);
  at::Tensor loss;
  if (o.use_softmax) {
    TORCH_CHECK(input.size(1) >= 2, "focal loss: softmax needs at least 2 channels, got shape ",
                input.sizes());
    auto ls = torch::log_softmax(input, 1);
    loss = -(1 - ls.exp()).pow(o.gamma) * ls * target;
    if (o.alpha) loss = loss * (target * *o.alpha + (1 - target) * (1 - *o.alpha));
  } else {
    // BCE with logits in a stable form, times (1 - p_t)^gamma computed in log space (MONAI).
    loss = input - input * target - F::logsigmoid(input);
    auto invprobs = F::logsigmoid(-input * (target * 2 - 1));
    loss = (invprobs * o.gamma).exp() * loss;
    if (o.alpha) loss = loss * (target * *o.alpha + (1 - target) * (1 - *o.alpha));
  }
  if (!o.include_background && input.size(1) > 1)
    loss = loss.index({torch::indexing::Slice(), torch::indexing::Slice(1)});
  return loss.mean();
}

at::Tensor iou_prediction_loss(const at::Tensor& mask_logits, const at::Tensor& iou_pred,
                               const at::Tensor& target) {
  TORCH_CHECK(iou_pred.dim() == 2 && iou_pred.size(1) == 1 && mask_logits.size(0) == iou_pred.size(0),
              "iou_prediction_loss: expected iou_pred (B, 1) for ", mask_logits.size(0), " masks, got ",
              iou_pred.sizes());
  at::Tensor true_iou;
  {
    torch::NoGradGuard ng;
    const at::Tensor pred = (mask_logits > 0).flatten(1), ref = (target > 0).flatten(1);
    const at::Tensor inter = pred.logical_and(ref).sum(1).to(at::kFloat);
    const at::Tensor uni = pred.logical_or(ref).sum(1).to(at::kFloat);
    true_iou = torch::where(uni > 0, inter / uni.clamp_min(1), torch::ones_like(uni)).unsqueeze(1);
  }
  return F::mse_loss(iou_pred.to(at::kFloat), true_iou);
}

Status LossOptions::validate() const {
  SEGFLOW_RETURN_IF_ERROR(dice.validate());
  if (!(lambda_dice >= 0))
    return invalid_argument("loss: lambda_dice: expected >= 0, got " + std::to_string(lambda_dice));
  if (!(lambda_ce >= 0))
    return invalid_argument("loss: lambda_ce: expected >= 0, got " + std::to_string(lambda_ce));
  if (!(lambda_focal >= 0))
    return invalid_argument("loss: lambda_focal: expected >= 0, got " + std::to_string(lambda_focal));
  if (!(gamma >= 0)) return invalid_argument("loss: gamma: expected >= 0, got " + std::to_string(gamma));
  if (alpha && !(*alpha >= 0 && *alpha <= 1))
    return invalid_argument("loss: alpha: expected a number in [0, 1], got " + std::to_string(*alpha));
  for (double w : ce_weight)
    if (!(w >= 0)) return invalid_argument("loss: ce_weight: expected non-negative numbers");
  if (!(iou_weight >= 0))
    return invalid_argument("loss: iou_weight: expected >= 0, got " + std::to_string(iou_weight));
  return Status::ok();
}

// ------------------------------------------------------------------------------ the table

namespace {

/// What the factories build from: the options of one loss, resolved once.
struct LossParts {
  DiceLossOptions dice;
  FocalLossOptions focal;
  std::vector<double> ce_weight;
  double lambda_dice = 1.0, lambda_ce = 1.0, lambda_focal = 1.0;
};

/// One loss: its kind, its name in a job config, the activation a given name brings, how it
/// is built and what it is.
struct LossEntry {
  LossKind kind;
  const char* name;
  LossActivation default_act;  ///< what a given name sets: softmax or sigmoid before Dice
  LossFn (*make)(const LossParts& parts);
  const char* description;
};

using Arg = const at::Tensor&;

/// CE class weights as a tensor, made on the first step's device and dtype and kept: a
/// tensor built from a host vector every step is a blocking host-to-device copy on CUDA.
/// Shared by the copies of one loss function; the lock covers a loss called from several
/// threads.
class ClassWeights {
 public:
  explicit ClassWeights(std::vector<double> w) : values_(std::move(w)) {}
  at::Tensor on(const at::Tensor& input) const {
    if (values_.empty()) return {};
    std::lock_guard<std::mutex> lock(mutex_);
    if (!tensor_.defined() || tensor_.device() != input.device() || tensor_.dtype() != input.dtype())
      tensor_ = torch::tensor(values_, input.options());
    return tensor_;
  }

 private:
  std::vector<double> values_;
  mutable std::mutex mutex_;
  mutable at::Tensor tensor_;
};

LossFn make_dice(const LossParts& p) {
  return [d = p.dice](Arg x, Arg t) { return dice_loss(x, t, d); };
}
LossFn make_ce(const LossParts& p) {
  return [w = std::make_shared<ClassWeights>(p.ce_weight)](Arg x, Arg t) { return ce_loss(x, t, w->on(x)); };
}
LossFn make_bce(const LossParts&) {
  return [](Arg x, Arg t) { return bce_with_logits_loss(x, t); };
}
LossFn make_dice_ce(const LossParts& p) {
  return [d = p.dice, w = std::make_shared<ClassWeights>(p.ce_weight), ld = p.lambda_dice, lc = p.lambda_ce](
             Arg x, Arg t) {
    auto ce = x.size(1) == 1 ? bce_with_logits_loss(x, t) : ce_loss(x, t, w->on(x));
    return ld * dice_loss(x, t, d) + lc * ce;
  };
}
LossFn make_dice_bce(const LossParts& p) {
  return [d = p.dice, ld = p.lambda_dice, lc = p.lambda_ce](Arg x, Arg t) {
    return ld * dice_loss(x, t, d) + lc * bce_with_logits_loss(x, prepare_target(x, t, d.to_onehot_y));
  };
}
LossFn make_focal(const LossParts& p) {
  return [f = p.focal](Arg x, Arg t) { return focal_loss(x, t, f); };
}
LossFn make_dice_focal(const LossParts& p) {
  return [d = p.dice, f = p.focal, ld = p.lambda_dice, lf = p.lambda_focal](Arg x, Arg t) {
    return ld * dice_loss(x, t, d) + lf * focal_loss(x, t, f);
  };
}

constexpr LossActivation kSoftmax = LossActivation::softmax, kSigmoid = LossActivation::sigmoid;

// The losses make_loss can build, in the order loss_names() lists them (and error messages
// say "expected one of ..."). Adding a loss: its LossKind value (losses.hpp), its factory
// above and one entry here.
// clang-format off
const LossEntry kLosses[] = {
    // kind                name          activation  factory           description
    {LossKind::dice,       "dice",       kSoftmax,   make_dice,        "Dice (MONAI DiceLoss)"},
    {LossKind::ce,         "ce",         kSoftmax,   make_ce,          "cross entropy"},
    {LossKind::bce,        "bce",        kSigmoid,   make_bce,         "binary cross entropy with logits"},
    {LossKind::dice_ce,    "dice_ce",    kSoftmax,   make_dice_ce,     "Dice + CE (BCE for one channel)"},
    {LossKind::dice_bce,   "dice_bce",   kSigmoid,   make_dice_bce,    "Dice + BCE on every channel"},
    {LossKind::focal,      "focal",      kSoftmax,   make_focal,       "focal (MONAI FocalLoss)"},
    {LossKind::dice_focal, "dice_focal", kSoftmax,   make_dice_focal,  "Dice + focal"},
};
// clang-format on

const LossEntry* find_loss(LossKind kind) {
  for (const auto& e : kLosses)
    if (e.kind == kind) return &e;
  return nullptr;
}

const LossEntry* find_loss(const std::string& name) {
  for (const auto& e : kLosses)
    if (name == e.name) return &e;
  return nullptr;
}

/// The `name` option's doc: every loss with its description.
std::string loss_names_doc() {
  std::string doc;
  for (const auto& e : kLosses) doc += std::string(doc.empty() ? "" : "; ") + e.name + ": " + e.description;
  return doc;
}

}  // namespace

const char* to_string(DeepSupervisionWeights weights) {
  switch (weights) {
    case DeepSupervisionWeights::halving:
      return "halving";
    case DeepSupervisionWeights::nnunet:
      return "nnunet";
    case DeepSupervisionWeights::none:
      return "none";
  }
  return "?";
}

const char* to_string(LossKind kind) {
  const LossEntry* e = find_loss(kind);
  return e ? e->name : "unknown";
}

std::vector<std::string> loss_names() {
  std::vector<std::string> names;
  for (const auto& e : kLosses) names.push_back(e.name);
  return names;
}

Result<LossFn> make_loss(const LossOptions& o) {
  SEGFLOW_RETURN_IF_ERROR(o.validate());
  const LossEntry* entry = find_loss(o.kind);
  if (!entry) return invalid_argument("loss: unknown kind");
  LossParts parts;
  parts.dice = o.dice;
  parts.focal.gamma = o.gamma;
  parts.focal.alpha = o.alpha;
  parts.focal.use_softmax = o.focal_softmax;
  parts.focal.include_background = o.dice.include_background;
  parts.focal.to_onehot_y = o.dice.to_onehot_y;
  parts.ce_weight = o.ce_weight;
  parts.lambda_dice = o.lambda_dice;
  parts.lambda_ce = o.lambda_ce;
  parts.lambda_focal = o.lambda_focal;
  return entry->make(parts);
}

void LossOptions::bind(pipeline::OptionParser& p) {
  using pipeline::Range;
  std::string name = to_string(kind);
  const std::string doc = loss_names_doc();
  p.choice("name", name, loss_names(), doc.c_str());
  if (const LossEntry* e = find_loss(name)) kind = e->kind;
  // A given name brings its default activation (the table's: sigmoid for bce and dice_bce,
  // softmax otherwise); setting one of softmax and sigmoid true turns the other off unless
  // it is set as well.
  bool softmax = dice.act == LossActivation::softmax, sigmoid = dice.act == LossActivation::sigmoid;
  if (p.given("name")) {
    sigmoid = find_loss(kind)->default_act == LossActivation::sigmoid;
    softmax = !sigmoid;
  }
  p.boolean("softmax", softmax, "softmax over channels before the Dice term (needs >= 2 channels)");
  p.boolean("sigmoid", sigmoid, "sigmoid per channel before the Dice term");
  if (p.given("sigmoid") && sigmoid && !p.given("softmax")) softmax = false;
  if (p.given("softmax") && softmax && !p.given("sigmoid")) sigmoid = false;
  if (softmax && sigmoid) p.fail("sigmoid", "expected at most one of softmax and sigmoid true, got both");
  p.set_resolved("softmax", softmax);
  p.set_resolved("sigmoid", sigmoid);
  dice.act = softmax ? LossActivation::softmax : sigmoid ? LossActivation::sigmoid : LossActivation::none;
  p.boolean("include_background", dice.include_background, "score channel 0 too");
  p.boolean("to_onehot_y", dice.to_onehot_y, "the target is a label map: one-hot it to the channels");
  p.boolean("squared_pred", dice.squared_pred, "squares in the Dice denominator (V-Net)");
  p.boolean("jaccard", dice.jaccard, "Jaccard (IoU) form instead of Dice");
  p.number("smooth_nr", dice.smooth_nr, Range::non_negative(), "", "added to the Dice numerator");
  p.number("smooth_dr", dice.smooth_dr, Range::positive(), "", "added to the Dice denominator");
  p.boolean("batch", dice.batch, "sum over the batch before the ratio (one score per class)");
  p.number_list("ce_weight", ce_weight, Range::non_negative(), "", "class weights of the CE term; [] = none");
  p.number("lambda_dice", lambda_dice, Range::non_negative(), "", "weight of the Dice term");
  p.number("lambda_ce", lambda_ce, Range::non_negative(), "", "weight of the CE / BCE term");
  p.number("lambda_focal", lambda_focal, Range::non_negative(), "", "weight of the focal term");
  p.number("gamma", gamma, Range::non_negative(), "", "focal exponent");
  p.number("alpha", alpha, Range::closed(0, 1), "", "focal alpha; null = none");
  p.boolean("focal_softmax", focal_softmax, "softmax focal term (MONAI FocalLoss use_softmax)");
  std::string ds = to_string(deep_supervision);
  p.choice("deep_supervision", ds, {"halving", "nnunet", "none"},
           "weights of a deep-supervised model's outputs (full resolution first): halving 1/2^i, "
           "nnunet 1/2^i with the lowest resolution 0, none the first output alone; normalised to 1");
  for (auto k :
       {DeepSupervisionWeights::halving, DeepSupervisionWeights::nnunet, DeepSupervisionWeights::none})
    if (ds == to_string(k)) deep_supervision = k;
  if (p.given("iou_weight"))
    p.number("iou_weight", iou_weight, Range::non_negative(), "",
             "weight of the IoU-prediction loss (box-prompted models with an IoU head; LiteMedSAM's "
             "iou_loss_weight); absent = 0, off");
  if (p.ok()) p.check(validate(), "loss");
}

void to_json(nlohmann::json& j, const LossOptions& options) { j = pipeline::resolved_options(options); }

Result<LossOptions> parse_loss_options(const nlohmann::json& j, const std::string& where) {
  return pipeline::parse_options<LossOptions>(j, where);
}

// ---------------------------------------------------------------------- DeepSupervisionLoss

DeepSupervisionLoss::DeepSupervisionLoss(LossFn loss, DeepSupervisionWeights kind)
    : loss_(std::move(loss)), kind_(kind) {}

DeepSupervisionLoss::DeepSupervisionLoss(LossFn loss, bool zero_lowest)
    : DeepSupervisionLoss(std::move(loss),
                          zero_lowest ? DeepSupervisionWeights::nnunet : DeepSupervisionWeights::halving) {}

std::vector<double> DeepSupervisionLoss::weights(size_t n, DeepSupervisionWeights kind) {
  std::vector<double> w(n);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    const bool zero = (kind == DeepSupervisionWeights::nnunet && n > 1 && i == n - 1) ||
                      (kind == DeepSupervisionWeights::none && i > 0);
    w[i] = zero ? 0.0 : std::pow(0.5, static_cast<double>(i));
    sum += w[i];
  }
  for (auto& x : w) x /= sum;
  return w;
}

std::vector<double> DeepSupervisionLoss::weights(size_t n, bool zero_lowest) {
  return weights(n, zero_lowest ? DeepSupervisionWeights::nnunet : DeepSupervisionWeights::halving);
}

at::Tensor DeepSupervisionLoss::downsample_target(const at::Tensor& target, at::IntArrayRef spatial) {
  if (target.sizes().slice(2) == spatial) return target;
  // ATen's nearest-exact kernels directly: F::interpolate warns about align_corners for it.
  auto t = target.to(torch::kFloat);
  switch (spatial.size()) {
    case 1:
      t = at::_upsample_nearest_exact1d(t, spatial);
      break;
    case 2:
      t = at::_upsample_nearest_exact2d(t, spatial);
      break;
    case 3:
      t = at::_upsample_nearest_exact3d(t, spatial);
      break;
    default:
      TORCH_CHECK(false, "deep supervision: expected 1 to 3 spatial dims, got ", spatial.size());
  }
  return t.to(target.scalar_type());
}

at::Tensor DeepSupervisionLoss::operator()(const std::vector<at::Tensor>& outputs,
                                           const at::Tensor& target) const {
  TORCH_CHECK(!outputs.empty(), "deep supervision loss: no outputs");
  const auto w = weights(outputs.size(), kind_);
  at::Tensor total;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (w[i] == 0.0) continue;
    auto t = downsample_target(target, outputs[i].sizes().slice(2));
    auto l = w[i] * loss_(outputs[i], t);
    total = total.defined() ? total + l : l;
  }
  return total;
}

}  // namespace segflow::models
