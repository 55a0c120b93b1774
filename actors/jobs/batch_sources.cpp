#include "actors/jobs/batch_sources.hpp"

#include <torch/torch.h>

#include "actors/actor_batch_source.hpp"
#include "pipeline/simple_loader.hpp"

namespace segflow::actors {

Result<std::unique_ptr<pipeline::BatchSource>> make_batch_source(const std::string& kind,
                                                                 const pipeline::LoaderOptions& options,
                                                                 std::shared_ptr<EventSink> events) {
  if (kind == "simple") {
    SEGFLOW_ASSIGN_OR_RETURN(auto s, pipeline::SimpleLoader::make(options));
    return std::unique_ptr<pipeline::BatchSource>(std::move(s));
  }
  if (kind == "actors") {
    ActorSourceOptions extra;
    if (events) extra.sinks.push_back(std::move(events));
    SEGFLOW_ASSIGN_OR_RETURN(auto s, ActorBatchSource::make(options, std::move(extra)));
    return std::unique_ptr<pipeline::BatchSource>(std::move(s));
  }
  return invalid_argument("train.loader: expected actors or simple, got \"" + kind + "\"");
}

}  // namespace segflow::actors
