#pragma once
// Forward declarations of segflow::models: the public types of the folder's headers, for
// headers that name them only by reference or pointer.

namespace segflow::models {

// training/checkpoint.hpp, training/trainer.hpp
struct StepInfo;
struct EpochInfo;
struct ValidationInfo;
struct TrainState;
class TrainObserver;
class GradientSync;
class AutocastGuard;
class Trainer;
class IntraOpTeam;
// training/job_config.hpp
struct DataSettings;
struct TrainSettings;
struct ValidationSettings;
struct JobConfig;
// nets/network.hpp
struct ModelInfo;
struct ModelOptions;
struct NetworkRow;
struct ExportedModel;
class ModelHandle;
// nets/layers.hpp, nets/unet.hpp, nets/plain_unet.hpp, nets/sam.hpp
struct SamModelOptions;
enum class NormKind;
enum class ActKind;
struct ConvOptions;
struct ConvBlockOptions;
struct UNetOptions;
struct PlainConvUNetOptions;
struct SamOptions;
class ConvNdImpl;
class ConvBlockImpl;
class UNetImpl;
class PlainConvUNetImpl;
class SamImpl;
// training/losses.hpp
enum class LossActivation;
enum class LossReduction;
enum class LossKind;
struct DiceLossOptions;
struct FocalLossOptions;
struct LossOptions;
class DeepSupervisionLoss;
// training/metrics.hpp, evidence/eval_metrics.hpp, evidence/evaluation.hpp
enum class EmptyClassPolicy;
struct DiceMetricOptions;
class DiceMetric;
struct ClassScores;
struct EvalMetricOptions;
struct EvaluateOptions;
struct EvaluationReport;
// training/optim.hpp
enum class ScheduleKind;
struct OptimizerOptions;
struct ScheduleOptions;
struct GradScalerOptions;
class LrSchedule;
class FusedOptimizer;
class GradScaler;
// training/sliding_window.hpp, inference/inference.hpp
enum class BlendMode;
enum class TtaMode;
struct SlidingWindowOptions;
struct InferOptions;
struct InferResult;
struct InferCase;
// inference/model_package.hpp
struct ModelPackage;

namespace parallel {
// parallel/collective.hpp, parallel/ddp_sync.hpp
enum class Backend;
struct CollectiveOptions;
struct DdpOptions;
class Collective;
class DdpGradientSync;
}  // namespace parallel

}  // namespace segflow::models
