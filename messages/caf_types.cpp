#include "messages/caf_types.hpp"

#include <caf/actor_system_config.hpp>
#include <caf/make_message.hpp>
#include <caf/message.hpp>

namespace segflow {

caf::error make_error(ErrorCode code, std::string message) {
  return caf::error(static_cast<std::uint8_t>(code), kErrorCategory, caf::make_message(std::move(message)));
}

caf::error to_caf_error(const Status& status) {
  if (status.is_ok()) return caf::none;
  return make_error(status.code(), status.message());
}

Status to_status(const caf::error& error) {
  if (!error) return Status::ok();
  if (error.category() == kErrorCategory) {
    const caf::message& ctx = error.context();
    std::string msg = ctx.size() == 1 && ctx.match_element<std::string>(0) ? ctx.get_as<std::string>(0)
                                                                           : caf::to_string(ctx);
    const auto code = static_cast<ErrorCode>(error.code());
    return Status(code == ErrorCode::ok ? ErrorCode::internal : code, std::move(msg));
  }
  return internal_error(caf::to_string(error));
}

void register_message_types(caf::actor_system_config& cfg) {
  cfg.add_message_types<caf::id_block::segflow>();
  cfg.add_error_category(kErrorCategory, [](std::uint8_t code, caf::atom_value, const caf::message& ctx) {
    std::string s = std::string("segflow: ") + to_string(static_cast<ErrorCode>(code));
    if (ctx.size() == 1 && ctx.match_element<std::string>(0)) s += ": " + ctx.get_as<std::string>(0);
    return s;
  });
}

}  // namespace segflow
