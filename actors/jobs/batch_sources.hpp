#pragma once
// Picks the data path of a job: "actors" (the CAF pipeline: decode pool, cache, augmenter,
// bounded prefetch) or "simple" (synchronous, in the trainer's thread: the baseline).

#include <memory>
#include <string>

#include "actors/collector.hpp"
#include "messages/status.hpp"
#include "pipeline/batch_source.hpp"

namespace segflow::actors {

/// Builds the BatchSource named `kind` for `options` (invalid_argument for another name).
/// `events`: the sink of the actors data path's collector (a run's event bus); the simple
/// loader has no collector and reports failed cases through the batch source only.
Result<std::unique_ptr<pipeline::BatchSource>> make_batch_source(const std::string& kind,
                                                                 const pipeline::LoaderOptions& options,
                                                                 std::shared_ptr<EventSink> events = nullptr);

}  // namespace segflow::actors
