#include "actors/decoder.hpp"

#include <torch/torch.h>

#include <caf/all.hpp>

#include <chrono>

#include "actors/detail/guard.hpp"
#include "actors/detail/intraop_threads.hpp"
#include "pipeline/cache/sample_cache.hpp"
#include "pipeline/pipeline_spec.hpp"

namespace segflow::actors {

decoder_actor::behavior_type decoder(decoder_actor::stateful_pointer<DecoderState> self,
                                     std::shared_ptr<const DecodeContext> ctx, collector_actor collector,
                                     int index) {
  detail::use_one_intraop_thread();  // runs on the actor's own (detached) thread
  auto& st = self->state;
  st.ctx = std::move(ctx);
  st.live = std::make_unique<LiveDecoder>(*st.ctx);
  st.collector = std::move(collector);
  st.source = "decoder[" + std::to_string(index) + "]";
  st.stream = std::make_unique<detail::DeviceStream>(st.ctx->cache_device);
  detail::install_exception_handler(self, st.collector, st.source);
  return {
      [self](decode_atom, std::int64_t index) -> caf::result<DecodeResult> {
        const DecodeContext& c = *self->state.ctx;
        if (index < 0 || index >= static_cast<std::int64_t>(c.cases.size()))
          return make_error(ErrorCode::invalid_argument,
                            self->state.source + ": no case with index " + std::to_string(index));
        const auto t0 = std::chrono::steady_clock::now();
        Result<pipeline::DecodedCase> r = internal_error("not decoded");
        try {
          r = pipeline::decode_case(c.cases[static_cast<std::size_t>(index)], *c.pipeline, c.disk.get(),
                                    c.det_spec, c.cache_dtype);
          if (r.is_ok() && c.cache_device.is_cuda() && index < c.cacheable) {
            // Into the CUDA cache here, off the cache actor: on this decoder's own stream,
            // waited for, so that any stream may read the tensors afterwards.
            auto& ds = *self->state.stream;
            detail::StreamScope scope(ds);
            auto moved = pipeline::move_to_cache_device(r.value().sample, c.cache_device);
            ds.synchronize();
            if (!moved.is_ok()) {
              r = moved.status();
            } else {
              r.value().sample = std::move(moved).value();
            }
          }
        } catch (const c10::Error& e) {
          r = internal_error("case '" + c.cases[static_cast<std::size_t>(index)].id +
                             "': " + e.what_without_backtrace());
        } catch (const std::exception& e) {
          r = internal_error("case '" + c.cases[static_cast<std::size_t>(index)].id + "': " + e.what());
        }
        if (!r.is_ok()) return to_caf_error(r.status());
        DecodeResult out;
        out.sample = std::move(r.value().sample);
        out.from_disk = r.value().from_disk;
        out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        return out;
      },
  };
}

}  // namespace segflow::actors
