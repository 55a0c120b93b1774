#pragma once
// Forward declarations of segflow::pipeline.
namespace segflow::pipeline {
struct Image;
struct CaseEntry;
struct DatasetIndex;
struct LoadedCase;
struct DicomSeriesInfo;
struct SynthOptions;
struct Phantom;
}  // namespace segflow::pipeline
