#include "daemon/dicom/tags.hpp"

#include <dcmtk/config/osconfig.h>
#include <dcmtk/dcmdata/dcitem.h>

namespace segflow::daemon::dicom {

std::string tag_text(DcmItem& item, const DcmTagKey& key) {
  OFString v;
  if (item.findAndGetOFString(key, v).bad()) return "";
  std::string s = v.c_str();
  while (!s.empty() && (s.back() == ' ' || s.back() == '\0')) s.pop_back();
  return s;
}

}  // namespace segflow::daemon::dicom
