#pragma once
// Reading DICOM attributes as text, for the node's store and the result sender.

#include <string>

class DcmItem;
class DcmTagKey;

namespace segflow::daemon::dicom {

/// The value of `key` in `item` as text, trailing spaces and NULs (DICOM padding) removed;
/// empty when the attribute is absent or unreadable.
std::string tag_text(DcmItem& item, const DcmTagKey& key);

}  // namespace segflow::daemon::dicom
