#pragma once
// Forward declarations of segflow::pipeline: the public types of the folder's headers, for
// headers that name them only by reference or pointer.

namespace segflow::pipeline {

// options.hpp, stage.hpp, stage_registry.hpp, pipeline_spec.hpp, plugin.hpp
struct Range;
struct OptionInfo;
class OptionParser;
class Rng;
class Stage;
class MapStage;
class SourceStage;
struct StageInfo;
class StageRegistry;
struct StageSpec;
struct PipelineSpec;
class Pipeline;
struct LoadedPlugin;
// batch_source.hpp, staged_source.hpp, simple_loader.hpp, sampler.hpp, collate.hpp
struct LoaderOptions;
struct CaseFailure;
class BatchSource;
class StagedBatchSource;
class BatchAssembler;
class SimpleLoader;
struct SamplerOptions;
class EpochSampler;
struct CollateOptions;
// cache/
enum class CacheDtype;
struct DiskCacheOptions;
class DiskCache;
class MemoryCache;
// split.hpp, synth.hpp
struct SplitOptions;
struct Split;
struct SynthOptions;
struct Phantom;
// io/
struct Image;
enum class ImageFormat;
struct ImageFormatInfo;
enum class DatasetLayout;
struct CaseEntry;
struct DatasetIndex;
struct ScanOptions;
struct LoadedCase;
struct DicomSeriesInfo;
struct SkippedFile;
struct DicomReadReport;
struct DicomSegment;
enum class DicomCompression;
struct DicomWriteOptions;
struct SegmentStyle;

}  // namespace segflow::pipeline
