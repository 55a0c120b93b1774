// Fuzz harness: a DICOM SEG file: its segment list, its label map on its own grid, and the
// class names segflow derives from the segments.
#include "fuzz_target.hpp"
#include "pipeline/io/dicom.hpp"

SEGFLOW_FUZZ_TARGET(dicom_seg) {
  const auto file = write_input("input-seg.dcm", data, size);
  auto segments = pipeline::read_dicom_seg_segments(file);
  if (segments.is_ok()) {
    for (const auto& s : *segments)
      invariant(s.number >= 1 && s.number <= 65535, "segment number out of range");
    const auto names = pipeline::segment_class_names(*segments);
    invariant(names.empty() || names.front() == "background", "class 0 is not background");
  }
  auto labels = pipeline::read_dicom_seg(file);
  if (labels.is_ok()) {
    check_image(*labels);
    invariant(labels->channels() == 1, "a SEG label map has one channel");
  }
  return 0;
}
