#pragma once
// Forward declarations of segflow::models.
namespace segflow::models {
enum class NormKind;
enum class ActKind;
struct ConvOptions;
struct ConvBlockOptions;
struct UNetOptions;
struct PlainConvUNetOptions;
struct SamOptions;
struct LossOptions;
struct DiceLossOptions;
struct SlidingWindowOptions;
struct OptimizerOptions;
struct ScheduleOptions;
class DiceMetric;
class LrSchedule;
class ModelHandle;
class ConvNdImpl;
class ConvBlockImpl;
class UNetImpl;
class PlainConvUNetImpl;
class SamImpl;
}  // namespace segflow::models
