#pragma once
// Forward declarations of segflow::models: the public types of the folder's headers, for
// headers that name them only by reference or pointer.

namespace segflow::models {

// checkpoint.hpp, trainer.hpp
struct StepInfo;
struct EpochInfo;
struct ValidationInfo;
struct TrainState;
class TrainObserver;
class GradientSync;
class AutocastGuard;
class Trainer;
class IntraOpTeam;
// job_config.hpp
struct DataSettings;
struct TrainSettings;
struct ValidationSettings;
struct JobConfig;
// registry.hpp
struct ModelInfo;
struct ModelOptions;
struct SamModelOptions;
class ModelHandle;
// layers.hpp, unet.hpp, sam.hpp
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
// losses.hpp
enum class LossActivation;
enum class LossReduction;
enum class LossKind;
struct DiceLossOptions;
struct FocalLossOptions;
struct LossOptions;
class DeepSupervisionLoss;
// metrics.hpp, eval_metrics.hpp, evaluation.hpp
enum class EmptyClassPolicy;
struct DiceMetricOptions;
class DiceMetric;
struct ClassScores;
struct EvalMetricOptions;
struct EvaluateOptions;
struct EvaluationReport;
// optim.hpp
enum class ScheduleKind;
struct OptimizerOptions;
struct ScheduleOptions;
struct GradScalerOptions;
class LrSchedule;
class FusedOptimizer;
class GradScaler;
// sliding_window.hpp, inference.hpp, export.hpp
enum class BlendMode;
enum class TtaMode;
struct SlidingWindowOptions;
struct InferOptions;
struct InferResult;
struct InferCase;
struct ExportedModel;

namespace parallel {
// parallel/collective.hpp, parallel/ddp_sync.hpp
enum class Backend;
struct CollectiveOptions;
struct DdpOptions;
class Collective;
class DdpGradientSync;
}  // namespace parallel

}  // namespace segflow::models
