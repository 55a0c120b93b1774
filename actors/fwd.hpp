#pragma once
// Forward declarations of segflow::actors.
namespace segflow::actors {
struct DecodeContext;
struct CacheConfig;
struct AugmenterConfig;
struct ActorSourceOptions;
struct PipelineStats;
class EventSink;
class JsonlSink;
class MemorySink;
class ActorBatchSource;
}  // namespace segflow::actors
