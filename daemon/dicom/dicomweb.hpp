#pragma once
// The DICOMweb services segflowd uses (PS3.18), over a WebClient: STOW-RS to send a result
// (one instance per request), with the multipart/related body it carries.
//
// A STOW-RS answer is read as PS3.18 10.5.3 says: the HTTP status and, in the DICOM JSON
// body, the FailedSOPSequence (0008,1198) with each instance's FailureReason (0008,1197).
// An instance in it is refused, and not retried, unless its reason says the server ran out
// of resources (A7xx, 0213); so is one a success answer lists neither as stored
// (ReferencedSOPSequence, when the answer has it) nor as failed. 5xx, 401/403/404
// (credentials or url, fixed in the config and taken at the next start), 408 and 429 are
// retried; other 4xx refuse the instance.
//
// Threading: free functions; each call uses only its client.

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "daemon/dicom/web_client.hpp"
#include "messages/status.hpp"

namespace segflow::daemon::dicom {

/// What a STOW-RS attempt did with an instance.
enum class StowResult : std::uint8_t {
  stored,   ///< the server answered success (warnings included)
  refused,  ///< the server refused it for good: not retried
  retry,    ///< no answer, or one that may change: retried with back-off
};
/// "stored", "refused", "retry".
const char* to_string(StowResult r);

struct StowOutcome {
  StowResult result = StowResult::retry;
  std::string detail;  ///< why ("HTTP 200 (OK): FailedSOPSequence: 1.2.3: FailureReason 0x0110 (...)")
};

/// Sends one DICOM Part 10 file by STOW-RS (POST <url>/studies) and reads the answer.
StowOutcome stow_instance(WebClient& client, const std::filesystem::path& file,
                          const std::string& sop_instance_uid);

/// A multipart/related body holding `part` as one part of type `type`; `boundary` gets the
/// boundary chosen (one that does not occur in `part`).
std::string multipart_body(std::string_view part, const std::string& type, std::string& boundary);

}  // namespace segflow::daemon::dicom
