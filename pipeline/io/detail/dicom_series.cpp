// DICOM series assembly: headers, stacks, the choice of the volume and the geometry rules
// (see detail/dicom_series.hpp for the rules).
#include "pipeline/io/detail/dicom_series.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <map>
#include <numbers>
#include <numeric>
#include <sstream>

namespace segflow::pipeline::detail {

namespace fs = std::filesystem;

namespace {

/// A number from any numeric VR (IS, DS, US, FD, ...), through its text.
std::optional<double> get_number(DcmItem& item, const DcmTagKey& tag) {
  auto s = get_string(item, tag);
  if (!s) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(s->c_str(), &end);
  if (end == s->c_str() || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::size_t split_index(const DcmTagKey& tag) {
  for (std::size_t i = 0; i < kSplitTags.size(); ++i)
    if (kSplitTags[i].tag == tag) return i;
  return kSplitTags.size();
}

void read_plain_tags(DcmItem& item, FrameInfo& g) {
  if (auto v = get_doubles<3>(item, DCM_ImagePositionPatient)) g.position = Vec3{(*v)[0], (*v)[1], (*v)[2]};
  if (auto v = get_doubles<6>(item, DCM_ImageOrientationPatient)) g.orientation = *v;
  if (auto v = get_doubles<2>(item, DCM_PixelSpacing)) g.pixel_spacing = *v;
  if (auto v = get_double(item, DCM_SliceThickness)) g.slice_thickness = *v;
  if (auto v = get_double(item, DCM_SpacingBetweenSlices)) g.spacing_between_slices = *v;
  if (auto v = get_double(item, DCM_RescaleSlope)) g.slope = *v;
  if (auto v = get_double(item, DCM_RescaleIntercept)) g.intercept = *v;
  for (std::size_t i = 0; i < kSplitTags.size(); ++i)
    if (auto v = get_number(item, kSplitTags[i].tag)) g.split[i] = *v;
}

/// Reads the functional-group macros of one item of the Shared or PerFrame sequence.
void read_functional_groups(DcmItem& fg, FrameInfo& g) {
  if (DcmItem* it = sequence_item(fg, DCM_PlanePositionSequence))
    if (auto v = get_doubles<3>(*it, DCM_ImagePositionPatient)) g.position = Vec3{(*v)[0], (*v)[1], (*v)[2]};
  if (DcmItem* it = sequence_item(fg, DCM_PlaneOrientationSequence))
    if (auto v = get_doubles<6>(*it, DCM_ImageOrientationPatient)) g.orientation = *v;
  if (DcmItem* it = sequence_item(fg, DCM_PixelMeasuresSequence)) {
    if (auto v = get_doubles<2>(*it, DCM_PixelSpacing)) g.pixel_spacing = *v;
    if (auto v = get_double(*it, DCM_SliceThickness)) g.slice_thickness = *v;
    if (auto v = get_double(*it, DCM_SpacingBetweenSlices)) g.spacing_between_slices = *v;
  }
  if (DcmItem* it = sequence_item(fg, DCM_PixelValueTransformationSequence)) {
    if (auto v = get_double(*it, DCM_RescaleSlope)) g.slope = *v;
    if (auto v = get_double(*it, DCM_RescaleIntercept)) g.intercept = *v;
  }
  // Enhanced MR: the echo, the b-value and the temporal position of each frame.
  if (DcmItem* it = sequence_item(fg, DCM_MREchoSequence))
    if (auto v = get_number(*it, DCM_EffectiveEchoTime)) g.split[split_index(DCM_EffectiveEchoTime)] = *v;
  if (DcmItem* it = sequence_item(fg, DCM_MRDiffusionSequence))
    if (auto v = get_number(*it, DCM_DiffusionBValue)) g.split[split_index(DCM_DiffusionBValue)] = *v;
  if (DcmItem* it = sequence_item(fg, DCM_FrameContentSequence))
    if (auto v = get_number(*it, DCM_TemporalPositionIndex))
      g.split[split_index(DCM_TemporalPositionIndex)] = *v;
}

Vec3 row_cosine(const std::array<double, 6>& o) { return normalized({o[0], o[1], o[2]}); }
Vec3 col_cosine(const std::array<double, 6>& o) { return normalized({o[3], o[4], o[5]}); }
Vec3 slice_normal(const std::array<double, 6>& o) { return normalized(cross(row_cosine(o), col_cosine(o))); }

/// Slice spacing of a slice without neighbours: SpacingBetweenSlices, else SliceThickness, else 1.
double lone_slice_spacing(const FrameInfo& g) {
  if (g.spacing_between_slices && *g.spacing_between_slices > 0) return *g.spacing_between_slices;
  if (g.slice_thickness && *g.slice_thickness > 0) return *g.slice_thickness;
  return 1.0;
}

bool same_orientation(const std::optional<std::array<double, 6>>& a,
                      const std::optional<std::array<double, 6>>& b) {
  if (a.has_value() != b.has_value()) return false;
  if (!a) return true;
  for (int i = 0; i < 6; ++i)
    if (std::abs((*a)[i] - (*b)[i]) > kOrientationTolerance) return false;
  return true;
}

bool same_pixel_spacing(const std::optional<std::array<double, 2>>& a,
                        const std::optional<std::array<double, 2>>& b) {
  if (a.has_value() != b.has_value()) return false;
  if (!a) return true;
  for (int i = 0; i < 2; ++i)
    if (std::abs((*a)[i] - (*b)[i]) > kPixelSpacingTolerance * std::max(std::abs((*a)[i]), std::abs((*b)[i])))
      return false;
  return true;
}

std::string fixed(double v, int digits) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(digits) << v;
  return os.str();
}

std::string format_value(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

std::string slice_name(const std::vector<Header>& hs, const Slice& s) {
  const Header& h = hs[s.file];
  if (h.frames > 1) return h.file.string() + " frame " + std::to_string(s.frame + 1);
  return h.file.string();
}

std::string series_identity(const Header& h) {
  if (!h.series_uid.empty()) return "SeriesInstanceUID " + h.series_uid;
  if (!h.frame_of_reference_uid.empty()) return "FrameOfReferenceUID " + h.frame_of_reference_uid;
  return "no SeriesInstanceUID or FrameOfReferenceUID";
}

bool same_series_without_uid(const Header& a, const Header& b) {
  if (a.frame_of_reference_uid != b.frame_of_reference_uid || a.modality != b.modality || a.rows != b.rows ||
      a.columns != b.columns || a.samples != b.samples)
    return false;
  if (a.frame_info.empty() || b.frame_info.empty()) return a.frame_info.empty() == b.frame_info.empty();
  return same_orientation(a.frame_info.front().orientation, b.frame_info.front().orientation) &&
         same_pixel_spacing(a.frame_info.front().pixel_spacing, b.frame_info.front().pixel_spacing);
}

Result<Header> parse_header(const fs::path& file, DcmFileFormat& ff) {
  DcmDataset& ds = *ff.getDataset();
  DcmMetaInfo* meta = ff.getMetaInfo();
  Header h;
  h.file = file;
  h.series_uid = get_string(ds, DCM_SeriesInstanceUID).value_or("");
  h.frame_of_reference_uid = get_string(ds, DCM_FrameOfReferenceUID).value_or("");
  h.modality = get_string(ds, DCM_Modality).value_or("");
  // Anonymisers that blank the dataset's UIDs often leave the meta header's copies.
  h.sop_class_uid = get_string(ds, DCM_SOPClassUID).value_or("");
  if (h.sop_class_uid.empty() && meta)
    h.sop_class_uid = get_string(*meta, DCM_MediaStorageSOPClassUID).value_or("");
  h.sop_instance_uid = get_string(ds, DCM_SOPInstanceUID).value_or("");
  if (h.sop_instance_uid.empty() && meta)
    h.sop_instance_uid = get_string(*meta, DCM_MediaStorageSOPInstanceUID).value_or("");
  h.photometric = get_string(ds, DCM_PhotometricInterpretation).value_or("");
  if (auto v = get_integer(ds, DCM_Rows)) h.rows = *v;
  if (auto v = get_integer(ds, DCM_Columns)) h.columns = *v;
  h.samples = get_integer(ds, DCM_SamplesPerPixel).value_or(1);
  h.bits_allocated = get_integer(ds, DCM_BitsAllocated).value_or(16);
  h.gantry_tilt = get_double(ds, DCM_GantryDetectorTilt);
  if (ds.tagExists(DCM_NumberOfFrames)) {
    auto n = get_integer(ds, DCM_NumberOfFrames);
    if (!n || *n < 1)
      return corrupt_data(file.string() + ": " + tag_name(DCM_NumberOfFrames) +
                          ": expected a positive integer, got \"" +
                          get_string(ds, DCM_NumberOfFrames).value_or("") + "\"");
    h.frames = *n;
  }
  h.has_pixel_data = ds.tagExists(DCM_PixelData);

  FrameInfo base;
  read_plain_tags(ds, base);
  if (DcmItem* shared = sequence_item(ds, DCM_SharedFunctionalGroupsSequence))
    read_functional_groups(*shared, base);
  h.frame_info.assign(static_cast<std::size_t>(h.frames), base);
  bool per_frame_positions = false;
  DcmSequenceOfItems* per_frame = nullptr;
  if (ds.findAndGetSequence(DCM_PerFrameFunctionalGroupsSequence, per_frame).good() && per_frame) {
    if (per_frame->card() != static_cast<unsigned long>(h.frames))
      return corrupt_data(file.string() + ": " + tag_name(DCM_PerFrameFunctionalGroupsSequence) +
                          ": expected " + std::to_string(h.frames) + " items (NumberOfFrames), got " +
                          std::to_string(per_frame->card()));
    for (long f = 0; f < h.frames; ++f) {
      DcmItem* it = per_frame->getItem(static_cast<unsigned long>(f));
      if (!it) continue;
      std::optional<Vec3> before = h.frame_info[f].position;
      h.frame_info[f].position.reset();
      read_functional_groups(*it, h.frame_info[f]);
      if (h.frame_info[f].position)
        per_frame_positions = true;
      else
        h.frame_info[f].position = before;
    }
  }
  // Classic multi-frame (RT Dose, NM, ...): one top-level position for the first frame, the
  // others along the slice normal at GridFrameOffsetVector or a constant spacing.
  if (h.frames > 1 && !per_frame_positions && base.position && base.orientation) {
    Vec3 n = slice_normal(*base.orientation);
    std::vector<double> offsets(static_cast<std::size_t>(h.frames));
    if (value_count(ds, DCM_GridFrameOffsetVector) == static_cast<unsigned long>(h.frames)) {
      for (long f = 0; f < h.frames; ++f) {
        auto v = get_double(ds, DCM_GridFrameOffsetVector, static_cast<unsigned long>(f));
        if (!v)
          return corrupt_data(file.string() + ": " + tag_name(DCM_GridFrameOffsetVector) + ": value " +
                              std::to_string(f + 1) + " is not a number");
        offsets[f] = *v;
      }
      // A first offset that is not zero means the offsets are absolute (PS3.3 C.8.8.3.2).
      double first = offsets[0];
      for (double& o : offsets) o -= first;
    } else {
      double dz = lone_slice_spacing(base);
      for (long f = 0; f < h.frames; ++f) offsets[f] = dz * static_cast<double>(f);
    }
    for (long f = 0; f < h.frames; ++f) h.frame_info[f].position = add(*base.position, scale(n, offsets[f]));
  }
  return h;
}

namespace {

/// Everything that must be equal for slices to share a stack.
struct StackSignature {
  std::string identity;
  std::optional<std::array<double, 6>> orientation;
  std::optional<std::array<double, 2>> pixel_spacing;
  long rows = 0, columns = 0, samples = 1;
  long multi_frame_file = -1;  ///< the file, for a multi-frame file's frames
};

bool matches(const StackSignature& a, const StackSignature& b) {
  return a.identity == b.identity && a.rows == b.rows && a.columns == b.columns && a.samples == b.samples &&
         a.multi_frame_file == b.multi_frame_file && same_orientation(a.orientation, b.orientation) &&
         same_pixel_spacing(a.pixel_spacing, b.pixel_spacing);
}

std::string describe(const StackSignature& s, const std::vector<Header>& hs) {
  std::string out = s.identity;
  out += s.orientation ? ", orientation " + format_numbers(s.orientation->data(), 6) : ", no orientation";
  out += ", " + std::to_string(s.rows) + " x " + std::to_string(s.columns);
  if (s.samples != 1) out += " x " + std::to_string(s.samples) + " samples";
  if (s.pixel_spacing) out += ", pixel spacing " + format_numbers(s.pixel_spacing->data(), 2);
  if (s.multi_frame_file >= 0)
    out += ", multi-frame file " + hs[static_cast<std::size_t>(s.multi_frame_file)].file.filename().string();
  return out;
}

std::vector<fs::path> files_of(const std::vector<Header>& hs, const std::vector<Slice>& slices) {
  std::vector<fs::path> out;
  for (const Slice& s : slices)
    if (out.empty() || out.back() != hs[s.file].file) out.push_back(hs[s.file].file);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

/// Positions along the normal, or nullopt when a slice has no position or orientation.
std::optional<std::vector<double>> projections(const std::vector<Slice>& slices) {
  std::vector<double> out;
  for (const Slice& s : slices) {
    if (!s.info->position || !s.info->orientation) return std::nullopt;
    out.push_back(dot(*s.info->position, slice_normal(*s.info->orientation)));
  }
  return out;
}

/// The first pair of slices at one position (indices into `slices`), if any.
std::optional<std::pair<std::size_t, std::size_t>> find_repeat(const std::vector<Slice>& slices) {
  auto proj = projections(slices);
  if (!proj || slices.size() < 2) return std::nullopt;
  std::vector<std::size_t> idx(slices.size());
  std::iota(idx.begin(), idx.end(), std::size_t{0});
  std::stable_sort(idx.begin(), idx.end(),
                   [&](std::size_t a, std::size_t b) { return (*proj)[a] < (*proj)[b]; });
  for (std::size_t k = 0; k + 1 < idx.size(); ++k)
    if ((*proj)[idx[k + 1]] - (*proj)[idx[k]] < kSamePositionMm) return std::pair{idx[k], idx[k + 1]};
  return std::nullopt;
}

/// Splits a stack with repeated positions by the first tag that tells every repeat apart:
/// the sub-stack of the lowest value goes to `kept`, the others to `skipped`. Sets
/// `stack.problem` when no tag does.
void split_repeats(const std::vector<Header>& hs, Stack& stack, std::vector<Stack>& kept,
                   std::vector<StackSkip>& skipped) {
  auto repeat = find_repeat(stack.slices);
  if (!repeat) {
    kept.push_back(std::move(stack));
    return;
  }
  for (std::size_t t = 0; t < kSplitTags.size(); ++t) {
    std::map<double, std::vector<Slice>> groups;
    bool all = true;
    for (const Slice& s : stack.slices) {
      if (!s.info->split[t]) {
        all = false;
        break;
      }
      groups[*s.info->split[t]].push_back(s);
    }
    if (!all || groups.size() < 2) continue;
    bool clean = true;
    for (const auto& [value, slices] : groups) clean = clean && !find_repeat(slices);
    if (!clean) continue;
    const char* tag = kSplitTags[t].name;
    const double lowest = groups.begin()->first;
    for (auto& [value, slices] : groups) {
      Stack sub;
      sub.key = stack.key + ", " + tag + " " + format_value(value);
      sub.slices = std::move(slices);
      sub.split_tag = tag;
      sub.split_value = value;
      if (value == lowest) {
        kept.push_back(std::move(sub));
      } else {
        skipped.push_back({sub.key, files_of(hs, sub.slices), sub.slices.size(),
                           "repeats the slice positions of the stack read (" + std::string(tag) + " " +
                               format_value(lowest) + "); repeats are split by " + tag +
                               " and the lowest value is read"});
      }
    }
    return;
  }
  const Slice& a = stack.slices[repeat->first];
  const Slice& b = stack.slices[repeat->second];
  const Slice& later = hs[a.file].file < hs[b.file].file || (a.file == b.file && a.frame < b.frame) ? b : a;
  const Slice& earlier = &later == &a ? b : a;
  std::string tried;
  for (const auto& t : kSplitTags) tried += std::string(tried.empty() ? "" : ", ") + t.name;
  stack.problem = slice_name(hs, later) + ": " + tag_name(DCM_ImagePositionPatient) +
                  ": duplicate slice position " + format_numbers(later.info->position->data(), 3) +
                  ", also in " + slice_name(hs, earlier) + "; no tag tells the repeats apart (tried " +
                  tried + ")";
  kept.push_back(std::move(stack));
}

}  // namespace

Result<StackChoice> choose_stack(const std::vector<Header>& hs) {
  if (hs.empty()) return invalid_argument("read_dicom_series: expected at least one file, got none");
  StackChoice choice;
  // Copies of one SOP instance (same SOPInstanceUID) count once.
  std::map<std::string, std::size_t> instances;
  std::vector<StackSignature> signatures;
  std::vector<Stack> stacks;
  for (std::size_t i = 0; i < hs.size(); ++i) {
    const Header& h = hs[i];
    if (h.frames == 1 && !h.sop_instance_uid.empty()) {
      auto [it, inserted] = instances.emplace(h.sop_instance_uid, i);
      if (!inserted) {
        choice.duplicate_files.emplace_back(
            h.file, h.file.string() + ": a copy of " + hs[it->second].file.string() +
                        " (same SOPInstanceUID " + h.sop_instance_uid + "); read once");
        continue;
      }
    }
    for (long f = 0; f < h.frames; ++f) {
      const FrameInfo& fi = h.frame_info[static_cast<std::size_t>(f)];
      StackSignature sig{series_identity(h),
                         fi.orientation,
                         fi.pixel_spacing,
                         h.rows.value_or(0),
                         h.columns.value_or(0),
                         h.samples,
                         h.frames > 1 ? static_cast<long>(i) : -1};
      std::size_t k = 0;
      while (k < signatures.size() && !matches(signatures[k], sig)) ++k;
      if (k == signatures.size()) {
        signatures.push_back(sig);
        stacks.push_back({});
        stacks.back().key = describe(sig, hs);
      }
      stacks[k].slices.push_back({i, f, &fi});
    }
  }

  std::vector<Stack> candidates;
  for (Stack& s : stacks) split_repeats(hs, s, candidates, choice.skipped);
  if (candidates.empty()) return invalid_argument(hs.front().file.string() + ": no image slices to read");
  auto first_file = [&](const Stack& s) {
    fs::path best = hs[s.slices.front().file].file;
    for (const Slice& sl : s.slices) best = std::min(best, hs[sl.file].file);
    return best;
  };
  std::stable_sort(candidates.begin(), candidates.end(), [&](const Stack& a, const Stack& b) {
    if (a.slices.size() != b.slices.size()) return a.slices.size() > b.slices.size();
    if (a.key != b.key) return a.key < b.key;
    return first_file(a) < first_file(b);
  });
  Stack& chosen = candidates.front();
  if (chosen.slices.size() == 1 && candidates.size() > 1) {
    std::string msg =
        hs.front().file.parent_path().string() +
        ": no stack of 2 or more parallel slices to read: " + std::to_string(candidates.size()) +
        " single slices that differ in series, orientation or size (localizers?): ";
    for (std::size_t i = 0; i < candidates.size() && i < 4; ++i)
      msg += std::string(i ? "; " : "") + hs[candidates[i].slices.front().file].file.filename().string() +
             " (" + candidates[i].key + ")";
    if (candidates.size() > 4) msg += "; ...";
    return invalid_argument(msg);
  }
  if (!chosen.problem.empty()) return corrupt_data(chosen.problem);
  for (std::size_t i = 1; i < candidates.size(); ++i) {
    const Stack& s = candidates[i];
    std::string reason =
        s.slices.size() < chosen.slices.size()
            ? std::to_string(s.slices.size()) + (s.slices.size() == 1 ? " slice" : " slices") +
                  ", fewer than the " + std::to_string(chosen.slices.size()) + " of the stack read"
            : std::to_string(s.slices.size()) +
                  " slices, as many as the stack read, which comes first by series, orientation and size";
    if (!s.problem.empty()) reason += "; it also has " + s.problem;
    choice.skipped.push_back({s.key, files_of(hs, s.slices), s.slices.size(), std::move(reason)});
  }
  choice.chosen = std::move(chosen);
  return choice;
}

namespace {

Status check_orientation(const std::vector<Header>& hs, const Slice& s) {
  const auto& o = *s.info->orientation;
  Vec3 r{o[0], o[1], o[2]}, c{o[3], o[4], o[5]};
  if (std::abs(norm(r) - 1) > 1e-2 || std::abs(norm(c) - 1) > 1e-2 || std::abs(dot(r, c)) > 1e-2)
    return corrupt_data(slice_name(hs, s) + ": " + tag_name(DCM_ImageOrientationPatient) +
                        ": expected two orthogonal unit vectors, got " + format_numbers(o.data(), 6));
  return Status::ok();
}

void set_direction(Geometry& g, const std::array<double, 6>& o) {
  Vec3 r = row_cosine(o), c = col_cosine(o), n = slice_normal(o);
  for (int i = 0; i < 3; ++i) {
    g.direction[i * 3 + 0] = r[i];
    g.direction[i * 3 + 1] = c[i];
    g.direction[i * 3 + 2] = n[i];
  }
}

/// `slices` sorted along the normal `n` (stable), with their positions along it; a position
/// used twice is an error.
struct SortedSlices {
  std::vector<Slice> slices;
  std::vector<double> along;  ///< mm along the normal
  std::vector<double> steps;  ///< along[k + 1] - along[k]
};

Result<SortedSlices> sort_along_normal(const std::vector<Header>& hs, const std::vector<Slice>& slices,
                                       const Vec3& n) {
  std::vector<double> proj(slices.size());
  for (std::size_t i = 0; i < slices.size(); ++i) proj[i] = dot(*slices[i].info->position, n);
  std::vector<std::size_t> idx(slices.size());
  std::iota(idx.begin(), idx.end(), std::size_t{0});
  std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return proj[a] < proj[b]; });
  SortedSlices out;
  for (std::size_t i : idx) {
    out.slices.push_back(slices[i]);
    out.along.push_back(proj[i]);
  }
  for (std::size_t k = 0; k + 1 < out.slices.size(); ++k) {
    const double d = out.along[k + 1] - out.along[k];
    if (d < kSamePositionMm) {
      const Vec3& p = *out.slices[k + 1].info->position;
      return corrupt_data(slice_name(hs, out.slices[k + 1]) + ": " + tag_name(DCM_ImagePositionPatient) +
                          ": duplicate slice position " + format_numbers(p.data(), 3) + ", also in " +
                          slice_name(hs, out.slices[k]));
    }
    out.steps.push_back(d);
  }
  return out;
}

/// Gantry tilt: slice positions that drift across the image plane from slice to slice by
/// more than kTiltDriftPixels pixels of `pixel` mm are unsupported.
Status check_tilt(const std::vector<Header>& hs, const SortedSlices& ss, const Vec3& n, double pixel) {
  const Vec3& p0 = *ss.slices.front().info->position;
  double max_drift = 0;
  std::size_t far = 1;
  for (std::size_t k = 1; k < ss.slices.size(); ++k) {
    const Vec3 d = sub(*ss.slices[k].info->position, p0);
    const double drift = norm(sub(d, scale(n, dot(d, n))));
    if (drift > max_drift) {
      max_drift = drift;
      far = k;
    }
  }
  if (max_drift <= kTiltDriftPixels * pixel) return Status::ok();
  const double along = ss.along[far] - ss.along[0];
  const double angle = std::atan2(max_drift, along) * 180.0 / std::numbers::pi;
  std::string msg = slice_name(hs, ss.slices[far]) + ": " + tag_name(DCM_ImagePositionPatient) +
                    ": slice positions run at " + fixed(angle, 1) + " degrees to the normal of " +
                    tag_name(DCM_ImageOrientationPatient) + " (in-plane drift " + fixed(max_drift, 2) +
                    " mm over " + fixed(along, 2) + " mm from " + slice_name(hs, ss.slices.front()) +
                    ", more than " + format_value(kTiltDriftPixels) + " pixel";
  if (const auto& t = hs[ss.slices.front().file].gantry_tilt)
    msg += "; GantryDetectorTilt " + format_value(*t);
  msg += "): gantry tilt; segflow does not resample tilted series";
  return unsupported(msg);
}

/// Every step within kStepTolerance of the lower median step (of two steps d and 2d, a
/// slice missing from three, d is the step): else a gap or uneven spacing.
Status check_even_steps(const std::vector<Header>& hs, const SortedSlices& ss) {
  const std::vector<double>& steps = ss.steps;
  std::vector<double> sorted_steps = steps;
  const std::size_t mid = (sorted_steps.size() - 1) / 2;
  std::nth_element(sorted_steps.begin(), sorted_steps.begin() + static_cast<std::ptrdiff_t>(mid),
                   sorted_steps.end());
  const double median = sorted_steps[mid];
  for (std::size_t k = 0; k < steps.size(); ++k) {
    if (std::abs(steps[k] - median) > kStepTolerance * median) {
      std::ostringstream os;
      os << slice_name(hs, ss.slices[k + 1]) << ": " << tag_name(DCM_ImagePositionPatient)
         << ": expected the slice " << median << " mm after " << slice_name(hs, ss.slices[k])
         << " along the slice normal (within " << kStepTolerance * 100 << " %), got " << steps[k] << " mm ("
         << (steps[k] > 1.5 * median ? "a slice is missing: gap in the series" : "uneven slice spacing")
         << ")";
      return corrupt_data(os.str());
    }
  }
  return Status::ok();
}

}  // namespace

Result<Geometry> assemble_geometry(const std::vector<Header>& hs, std::vector<Slice>& slices,
                                   SpacingStats& stats) {
  Geometry g;
  const FrameInfo& first = *slices.front().info;
  if (first.pixel_spacing) {
    if ((*first.pixel_spacing)[0] > 0 && (*first.pixel_spacing)[1] > 0) {
      g.spacing[0] = (*first.pixel_spacing)[1];  // column spacing: x
      g.spacing[1] = (*first.pixel_spacing)[0];  // row spacing: y
    }
    // Otherwise (radiographs write 0\0, RG1_*.dcm) 1 mm, as GDCM and SimpleITK use; the
    // caller reports it.
  }

  if (slices.size() == 1) {
    if (first.orientation) {
      SEGFLOW_RETURN_IF_ERROR(check_orientation(hs, slices.front()));
      set_direction(g, *first.orientation);
    }
    if (first.position) g.origin = *first.position;
    g.spacing[2] = lone_slice_spacing(first);
    return g;
  }

  const auto missing = std::find_if(slices.begin(), slices.end(),
                                    [](const Slice& s) { return !s.info->position || !s.info->orientation; });
  if (missing != slices.end()) {
    const bool any = std::any_of(slices.begin(), slices.end(),
                                 [](const Slice& s) { return s.info->position && s.info->orientation; });
    bool one_file = std::all_of(slices.begin(), slices.end(),
                                [&](const Slice& s) { return s.file == slices.front().file; });
    if (one_file && !any) {
      // A multi-frame file without any position (secondary capture): frames in file order.
      g.spacing[2] = lone_slice_spacing(first);
      return g;
    }
    const DcmTagKey tag = missing->info->position ? DCM_ImageOrientationPatient : DCM_ImagePositionPatient;
    return corrupt_data(slice_name(hs, *missing) + ": " + tag_name(tag) +
                        ": required tag is missing (needed to order " + std::to_string(slices.size()) +
                        " slices)");
  }

  SEGFLOW_RETURN_IF_ERROR(check_orientation(hs, slices.front()));
  const auto& o0 = *first.orientation;
  const Vec3 n = slice_normal(o0);
  SEGFLOW_ASSIGN_OR_RETURN(SortedSlices ss, sort_along_normal(hs, slices, n));
  SEGFLOW_RETURN_IF_ERROR(check_tilt(hs, ss, n, std::min(g.spacing[0], g.spacing[1])));
  SEGFLOW_RETURN_IF_ERROR(check_even_steps(hs, ss));
  set_direction(g, o0);
  g.origin = *ss.slices.front().info->position;
  const std::vector<double>& steps = ss.steps;
  stats.mean_step = (ss.along.back() - ss.along.front()) / static_cast<double>(ss.slices.size() - 1);
  stats.min_step = *std::min_element(steps.begin(), steps.end());
  stats.max_step = *std::max_element(steps.begin(), steps.end());
  stats.max_deviation = std::max(stats.max_step - stats.mean_step, stats.mean_step - stats.min_step);
  g.spacing[2] = stats.mean_step;
  slices = std::move(ss.slices);
  return g;
}

}  // namespace segflow::pipeline::detail
