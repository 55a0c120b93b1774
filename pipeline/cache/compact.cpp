#include "pipeline/cache/compact.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pipeline/pipeline_spec.hpp"
#include "pipeline/transforms/crop.hpp"

namespace segflow::pipeline {

namespace {

// Packed index set, one int64 tensor:
//   [0] kPackedMagic  [1] extent (voxels of the grid)  [2] count (indices in the set)
//   [3] nwords = ceil(extent / 64)
//   [4, 4 + nwords)   bit words: bit i of word w <=> index 64 w + i is in the set
//   then nblocks + 1 running counts, nblocks = ceil(nwords / 8): rank[b] = bits set in
//   words [0, 8 b) (blocks of 512 voxels), rank[nblocks] = count.
constexpr std::int64_t kPackedMagic = 0x5346504b49445831;  // "SFPKIDX1"
constexpr std::int64_t kHeader = 4;
constexpr std::int64_t kWordsPerBlock = 8;

// Marker kinds (~c:key = [kind, original c10::ScalarType, code offset]).
constexpr std::int64_t kCast = 1;
constexpr std::int64_t kPalette = 2;
constexpr std::int64_t kPacked = 3;

constexpr std::int64_t kMaxPalette = 65536;
constexpr std::int64_t kPaletteProbe = 1 << 18;  // elements looked at before a full unique

std::string marker_key(const std::string& key) { return kCompactMarkerPrefix + key; }
std::string table_key(const std::string& key) { return kCompactTablePrefix + key; }

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

at::Tensor make_marker(std::int64_t kind, c10::ScalarType original, std::int64_t offset = 0) {
  return torch::tensor({kind, static_cast<std::int64_t>(original), offset}, torch::kLong);
}

std::int64_t bytes_of(const at::Tensor& t) { return t.numel() * static_cast<std::int64_t>(t.element_size()); }

/// The narrowest integer type holding [lo, hi] among uint8, int8, int16, int32.
std::optional<c10::ScalarType> narrowest_int(double lo, double hi) {
  if (lo >= 0 && hi <= 255) return torch::kUInt8;
  if (lo >= -128 && hi <= 127) return torch::kInt8;
  if (lo >= -32768 && hi <= 32767) return torch::kInt16;
  if (lo >= -2147483648.0 && hi <= 2147483647.0) return torch::kInt32;
  return std::nullopt;
}

/// One candidate form of a tensor: stored tensor, marker, optional table.
struct Form {
  at::Tensor stored, marker, table;
  std::int64_t bytes = std::numeric_limits<std::int64_t>::max();
};

/// [lo, hi] of a float tensor whose values are all finite integers and none is -0.0;
/// nullopt otherwise. One pass, no temporaries.
template <class T>
std::optional<std::pair<double, double>> integer_range(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  const T* p = c.data_ptr<T>();
  const std::int64_t n = c.numel();
  T lo = std::numeric_limits<T>::max(), hi = std::numeric_limits<T>::lowest();
  for (std::int64_t i = 0; i < n; ++i) {
    const T v = p[i];
    // NaN and inf fail the first test; -0.0 would lose its sign in an integer.
    if (!(std::trunc(v) == v) || !std::isfinite(v) || (v == 0 && std::signbit(v))) return std::nullopt;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  return std::make_pair(static_cast<double>(lo), static_cast<double>(hi));
}

/// Integer-valued tensors in a narrower integer type (exact).
std::optional<Form> cast_form(const at::Tensor& t) {
  const auto st = t.scalar_type();
  const bool floating = at::isFloatingType(st);
  if (!floating && !at::isIntegralType(st, /*includeBool=*/false)) return std::nullopt;
  if (t.numel() == 0) return std::nullopt;
  double lo = 0, hi = 0;
  if (floating) {
    std::optional<std::pair<double, double>> r;
    if (st == torch::kFloat)
      r = integer_range<float>(t);
    else if (st == torch::kDouble)
      r = integer_range<double>(t);
    if (!r) return std::nullopt;
    std::tie(lo, hi) = *r;
  } else {
    auto [lo_t, hi_t] = torch::aminmax(t);
    lo = lo_t.item<double>();
    hi = hi_t.item<double>();
  }
  const auto type = narrowest_int(lo, hi);
  if (!type || static_cast<std::int64_t>(c10::elementSize(*type)) >= t.element_size()) return std::nullopt;
  Form f;
  f.stored = t.to(*type);
  f.marker = make_marker(kCast, st);
  f.bytes = bytes_of(f.stored);
  return f;
}

/// Codes of `n` values (bit patterns of type U) into their sorted distinct values, when there
/// are at most `max_values`: the table (as U) and the codes (uint8 for <= 256 values, else
/// int16 minus 32768). Two passes over the data and a hash map of the distinct values: no
/// temporary of the volume's size (a sort-based unique needs ~24 bytes per voxel).
template <class U>
std::optional<std::pair<at::Tensor, at::Tensor>> palette_codes(const U* p, std::int64_t n,
                                                               std::int64_t max_values,
                                                               c10::ScalarType bits_type) {
  std::unordered_map<U, std::int32_t> code;
  code.reserve(static_cast<std::size_t>(std::min<std::int64_t>(max_values, 4096)) * 2);
  U last = p[0];
  code.emplace(last, 0);
  for (std::int64_t i = 1; i < n; ++i) {
    if (p[i] == last) continue;
    last = p[i];
    if (code.emplace(last, 0).second && static_cast<std::int64_t>(code.size()) > max_values)
      return std::nullopt;
  }
  std::vector<U> values;
  values.reserve(code.size());
  for (const auto& [v, c] : code) values.push_back(v);
  // Sorted as signed integers, as the earlier sort-based form did (any fixed order works:
  // the table travels with the codes).
  using S = std::make_signed_t<U>;
  std::sort(values.begin(), values.end(), [](U a, U b) { return static_cast<S>(a) < static_cast<S>(b); });
  for (std::size_t k = 0; k < values.size(); ++k) code[values[k]] = static_cast<std::int32_t>(k);
  const auto k = static_cast<std::int64_t>(values.size());
  at::Tensor table = torch::empty({k}, bits_type);
  std::memcpy(table.data_ptr(), values.data(), values.size() * sizeof(U));
  at::Tensor codes;
  auto fill = [&](auto* out, std::int32_t offset) {
    U prev = p[0];
    std::int32_t c = code.at(prev);
    for (std::int64_t i = 0; i < n; ++i) {
      if (p[i] != prev) {
        prev = p[i];
        c = code.find(prev)->second;
      }
      out[i] = static_cast<std::remove_pointer_t<decltype(out)>>(c - offset);
    }
  };
  if (k <= 256) {
    codes = torch::empty({n}, torch::kUInt8);
    fill(codes.data_ptr<std::uint8_t>(), 0);
  } else {
    codes = torch::empty({n}, torch::kInt16);
    fill(codes.data_ptr<std::int16_t>(), 32768);
  }
  return std::make_pair(std::move(table), std::move(codes));
}

/// float32/float64 tensors with at most `max_values` (<= 65536) distinct values as codes into
/// a table (exact: distinct bit patterns, so -0.0 and NaN payloads survive).
std::optional<Form> palette_form(const at::Tensor& t, std::int64_t max_values) {
  const auto st = t.scalar_type();
  if (st != torch::kFloat && st != torch::kDouble) return std::nullopt;
  const std::int64_t n = t.numel();
  if (n == 0) return std::nullopt;
  const at::Tensor bits = t.contiguous().view(st == torch::kFloat ? torch::kInt : torch::kLong).flatten();
  // A strided probe first: a continuous image shows too many values in a small sample.
  const std::int64_t step = std::max<std::int64_t>(1, n / kPaletteProbe);
  const at::Tensor probe = bits.slice(0, 0, n, step);
  if (std::get<0>(at::_unique(probe, /*sorted=*/false)).numel() > max_values) return std::nullopt;
  std::optional<std::pair<at::Tensor, at::Tensor>> pc;
  if (st == torch::kFloat)
    pc = palette_codes(reinterpret_cast<const std::uint32_t*>(bits.data_ptr<std::int32_t>()), n, max_values,
                       torch::kInt);
  else
    pc = palette_codes(reinterpret_cast<const std::uint64_t*>(bits.data_ptr<std::int64_t>()), n, max_values,
                       torch::kLong);
  if (!pc) return std::nullopt;
  Form f;
  f.stored = pc->second.view(t.sizes());
  f.marker = make_marker(kPalette, st, pc->second.scalar_type() == torch::kUInt8 ? 0 : 32768);
  f.table = pc->first.view(st).contiguous();
  f.bytes = bytes_of(f.stored) + bytes_of(f.table);
  return f;
}

/// Lossy float16/bfloat16 (float32/float64 inputs).
std::optional<Form> lossy_form(const at::Tensor& t, CacheDtype dtype) {
  const auto st = t.scalar_type();
  if (st != torch::kFloat && st != torch::kDouble) return std::nullopt;
  if (dtype == CacheDtype::float16) {
    // Beyond float16's range the value would become inf: keep such a tensor whole.
    if (t.numel() > 0 && t.abs().max().item<double>() > 65504.0) return std::nullopt;
  } else if (dtype != CacheDtype::bfloat16) {
    return std::nullopt;
  }
  Form f;
  f.stored = t.to(dtype == CacheDtype::float16 ? torch::kHalf : torch::kBFloat16);
  f.marker = make_marker(kCast, st);
  f.bytes = bytes_of(f.stored);
  return f;
}

/// The smallest exact form of `t`, else the lossy one when asked for, else none.
std::optional<Form> best_form(const at::Tensor& t, CacheDtype dtype) {
  std::optional<Form> best = cast_form(t);
  if (!best || best->stored.element_size() > 1) {
    // Against a 2-byte cast only a 1-byte palette (<= 256 values) can win.
    const std::int64_t max_values = best && best->stored.element_size() == 2 ? 256 : kMaxPalette;
    if (auto p = palette_form(t, max_values); p && (!best || p->bytes < best->bytes)) best = std::move(p);
  }
  if (!best || best->bytes > t.numel() * 2) {
    if (auto l = lossy_form(t, dtype); l && (!best || l->bytes < best->bytes)) best = std::move(l);
  }
  if (best && best->bytes >= bytes_of(t)) return std::nullopt;
  return best;
}

/// int64 index lists: packed set or int32 list, whichever is smaller (exact).
std::optional<Form> index_form(const at::Tensor& t) {
  if (t.scalar_type() != torch::kLong || t.dim() != 1) return std::nullopt;
  const std::int64_t n = t.numel();
  const std::int64_t extent = n > 0 ? t.max().item<std::int64_t>() + 1 : 0;
  if (n > 0 && t.min().item<std::int64_t>() < 0) return std::nullopt;
  const std::int64_t nwords = (extent + 63) / 64;
  const std::int64_t packed_bytes =
      8 * (kHeader + nwords + (nwords + kWordsPerBlock - 1) / kWordsPerBlock + 1);
  const std::int64_t list32_bytes = extent <= std::numeric_limits<std::int32_t>::max() ? 4 * n : bytes_of(t);
  if (packed_bytes < list32_bytes) {
    at::Tensor packed = pack_index_list(t, extent);
    // A list with repeats is not a set: leave it (rand_crop_pos_neg draws from the list).
    if (packed[2].item<std::int64_t>() == n) {
      Form f;
      f.stored = std::move(packed);
      f.marker = make_marker(kPacked, torch::kLong);
      f.bytes = packed_bytes;
      return f;
    }
  }
  if (list32_bytes < bytes_of(t)) {
    Form f;
    f.stored = t.to(torch::kInt);
    f.marker = make_marker(kCast, torch::kLong);
    f.bytes = list32_bytes;
    return f;
  }
  return std::nullopt;
}

struct MarkerView {
  std::int64_t kind = 0;
  c10::ScalarType original = torch::kFloat;
  std::int64_t offset = 0;
};

Result<MarkerView> read_marker(const at::Tensor& m, const std::string& key) {
  const at::Tensor c = m.device().is_cpu() ? m : m.cpu();
  if (c.scalar_type() != torch::kLong || c.numel() != 3)
    return internal_error("compact sample: marker of '" + key + "' is not 3 int64 values");
  const auto* p = c.contiguous().data_ptr<std::int64_t>();
  MarkerView v;
  v.kind = p[0];
  v.original = static_cast<c10::ScalarType>(p[1]);
  v.offset = p[2];
  if (v.kind < kCast || v.kind > kPacked)
    return internal_error("compact sample: marker of '" + key + "' has unknown kind " +
                          std::to_string(v.kind));
  return v;
}

}  // namespace

Result<CacheDtype> parse_cache_dtype(const std::string& text, const std::string& field) {
  for (CacheDtype d : {CacheDtype::exact, CacheDtype::float16, CacheDtype::bfloat16, CacheDtype::none})
    if (text == cache_dtype_name(d)) return d;
  return invalid_argument(field + ": expected exact, float16, bfloat16 or none, got \"" + text + "\"");
}

const char* cache_dtype_name(CacheDtype dtype) {
  switch (dtype) {
    case CacheDtype::exact:
      return "exact";
    case CacheDtype::float16:
      return "float16";
    case CacheDtype::bfloat16:
      return "bfloat16";
    case CacheDtype::none:
      return "none";
  }
  return "exact";
}

bool host_resident_key(const std::string& key) {
  return is_crop_index_key(key) || starts_with(key, kCompactMarkerPrefix);
}

bool is_compact(const Sample& s) {
  for (const auto& [key, t] : s.tensors)
    if (starts_with(key, kCompactMarkerPrefix)) return true;
  return false;
}

bool reads_compact(const Pipeline& pipeline) {
  const std::size_t b = pipeline.cache_boundary();
  return b < pipeline.size() && pipeline.stages()[b]->name() == "rand_crop_pos_neg";
}

Result<Sample> compact_sample(const Sample& s, CacheDtype dtype) {
  if (dtype == CacheDtype::none) return s;
  Sample out;
  out.id = s.id;
  out.geometry = s.geometry;
  try {
    for (const auto& [key, t] : s.tensors) {
      if (starts_with(key, "~")) {  // already compact (a marker or a table): kept
        out.tensors[key] = t;
        continue;
      }
      if (s.has(marker_key(key)) || !t.defined() || !t.device().is_cpu()) {
        out.tensors[key] = t;
        continue;
      }
      std::optional<Form> f;
      if (is_crop_index_key(key))
        f = index_form(t);
      else if (t.dim() >= 2)
        f = best_form(t, dtype);
      if (!f) {
        out.tensors[key] = t;
        continue;
      }
      out.tensors[key] = f->stored.contiguous();
      out.tensors[marker_key(key)] = f->marker;
      if (f->table.defined()) out.tensors[table_key(key)] = f->table;
    }
  } catch (const c10::Error& e) {
    return internal_error("compact sample '" + s.id + "': " + e.what_without_backtrace());
  }
  return out;
}

Result<Sample> expand_sample(Sample s) {
  if (!is_compact(s)) return s;
  std::vector<std::string> markers;
  for (const auto& [key, t] : s.tensors)
    if (starts_with(key, kCompactMarkerPrefix)) markers.push_back(key);
  try {
    for (const std::string& mk : markers) {
      const std::string key = mk.substr(std::char_traits<char>::length(kCompactMarkerPrefix));
      auto it = s.tensors.find(key);
      if (it != s.tensors.end()) {
        SEGFLOW_ASSIGN_OR_RETURN(MarkerView m, read_marker(s.at(mk), key));
        at::Tensor& t = it->second;
        if (m.kind == kCast) {
          t = t.to(m.original);
        } else if (m.kind == kPalette) {
          auto tab = s.tensors.find(table_key(key));
          if (tab == s.tensors.end())
            return internal_error("compact sample '" + s.id + "': '" + key + "' has no value table");
          at::Tensor idx = t.to(torch::kInt);
          if (m.offset != 0) idx = idx.add(m.offset);
          t = tab->second.index_select(0, idx.flatten()).view(t.sizes());
        } else {
          SEGFLOW_ASSIGN_OR_RETURN(PackedIndexSet set,
                                   PackedIndexSet::view(t, "'" + key + "' of '" + s.id + "'"));
          t = set.to_list();
        }
      }
      s.tensors.erase(mk);
      s.tensors.erase(table_key(key));
    }
  } catch (const c10::Error& e) {
    return internal_error("expand sample '" + s.id + "': " + e.what_without_backtrace());
  }
  return s;
}

std::int64_t sample_voxels(const Sample& s) {
  std::int64_t v = 0;
  for (const auto& [key, t] : s.tensors) {
    if (!t.defined() || t.dim() < 2 || starts_with(key, "~") || is_crop_index_key(key)) continue;
    v = std::max<std::int64_t>(v, t.numel() / std::max<std::int64_t>(1, t.size(0)));
  }
  return v;
}

namespace {

/// An empty packed set of `extent` voxels (header filled, count and ranks still 0) and a
/// pointer to its words.
at::Tensor empty_packed(std::int64_t extent, std::uint64_t** words) {
  const std::int64_t nwords = (extent + 63) / 64;
  const std::int64_t nblocks = (nwords + kWordsPerBlock - 1) / kWordsPerBlock;
  at::Tensor packed = torch::zeros({kHeader + nwords + nblocks + 1}, torch::kLong);
  auto* p = packed.data_ptr<std::int64_t>();
  p[0] = kPackedMagic;
  p[1] = extent;
  p[3] = nwords;
  *words = reinterpret_cast<std::uint64_t*>(p + kHeader);
  return packed;
}

/// Fills the running counts and the count of a packed set whose words are set.
void finish_packed(at::Tensor& packed) {
  auto* p = packed.data_ptr<std::int64_t>();
  const std::int64_t nwords = p[3];
  const std::int64_t nblocks = (nwords + kWordsPerBlock - 1) / kWordsPerBlock;
  const auto* words = reinterpret_cast<const std::uint64_t*>(p + kHeader);
  std::int64_t* ranks = p + kHeader + nwords;
  std::int64_t total = 0;
  for (std::int64_t w = 0; w < nwords; ++w) {
    if (w % kWordsPerBlock == 0) ranks[w / kWordsPerBlock] = total;
    total += std::popcount(words[w]);
  }
  ranks[nblocks] = total;
  p[2] = total;
}

}  // namespace

at::Tensor pack_index_mask(const at::Tensor& mask) {
  const at::Tensor m = mask.flatten().to(torch::kBool).cpu().contiguous();
  const std::int64_t extent = m.numel();
  std::uint64_t* words = nullptr;
  at::Tensor packed = empty_packed(extent, &words);
  const bool* b = m.data_ptr<bool>();
  for (std::int64_t i = 0; i < extent; ++i)
    if (b[i]) words[i >> 6] |= std::uint64_t{1} << (i & 63);
  finish_packed(packed);
  return packed;
}

at::Tensor pack_index_list(const at::Tensor& indices, std::int64_t extent) {
  std::uint64_t* words = nullptr;
  at::Tensor packed = empty_packed(extent, &words);
  if (indices.numel() > 0) {
    const at::Tensor idx = indices.to(torch::kLong).cpu().contiguous();
    const auto* q = idx.data_ptr<std::int64_t>();
    for (std::int64_t i = 0, n = idx.numel(); i < n; ++i) {
      TORCH_CHECK(q[i] >= 0 && q[i] < extent, "pack_index_list: index ", q[i], " outside [0, ", extent, ")");
      words[q[i] >> 6] |= std::uint64_t{1} << (q[i] & 63);
    }
  }
  finish_packed(packed);
  return packed;
}

Result<PackedIndexSet> PackedIndexSet::view(const at::Tensor& packed, const std::string& what) {
  auto bad = [&](const std::string& why) { return internal_error("packed index set " + what + ": " + why); };
  if (!packed.defined() || packed.scalar_type() != torch::kLong || packed.dim() != 1)
    return bad("expected a 1-D int64 tensor");
  PackedIndexSet s;
  s.holder_ = packed.cpu().contiguous();
  const std::int64_t n = s.holder_.numel();
  if (n < kHeader + 1) return bad("too short");
  const auto* p = s.holder_.data_ptr<std::int64_t>();
  if (p[0] != kPackedMagic) return bad("bad magic");
  s.extent_ = p[1];
  s.count_ = p[2];
  s.nwords_ = p[3];
  if (s.extent_ < 0 || s.nwords_ != (s.extent_ + 63) / 64) return bad("extent and word count disagree");
  s.nblocks_ = (s.nwords_ + kWordsPerBlock - 1) / kWordsPerBlock;
  if (n != kHeader + s.nwords_ + s.nblocks_ + 1) return bad("length does not match the extent");
  s.words_ = reinterpret_cast<const std::uint64_t*>(p + kHeader);
  s.ranks_ = p + kHeader + s.nwords_;
  if (s.ranks_[0] != 0 || s.ranks_[s.nblocks_] != s.count_ || s.count_ < 0 || s.count_ > s.extent_)
    return bad("running counts do not match the count");
  return s;
}

std::int64_t PackedIndexSet::select(std::int64_t k) const {
  // The block whose running count is the last one <= k; then popcounts inside it.
  const std::int64_t* hit = std::upper_bound(ranks_, ranks_ + nblocks_ + 1, k) - 1;
  const std::int64_t block = hit - ranks_;
  std::int64_t r = k - *hit;
  const std::int64_t end = std::min(nwords_, (block + 1) * kWordsPerBlock);
  for (std::int64_t w = block * kWordsPerBlock; w < end; ++w) {
    std::uint64_t x = words_[w];
    const auto pc = static_cast<std::int64_t>(std::popcount(x));
    if (r >= pc) {
      r -= pc;
      continue;
    }
    for (; r > 0; --r) x &= x - 1;  // drop the r lowest set bits
    return w * 64 + std::countr_zero(x);
  }
  return -1;  // k out of range (callers draw k in [0, size()))
}

at::Tensor PackedIndexSet::to_list() const {
  const at::Tensor words = holder_.slice(0, kHeader, kHeader + nwords_);
  const at::Tensor bytes = words.contiguous().view(torch::kUInt8).to(torch::kInt).view({-1, 1});
  const at::Tensor weights = torch::tensor({1, 2, 4, 8, 16, 32, 64, 128}, torch::kInt);
  const at::Tensor mask = torch::ne(torch::bitwise_and(bytes, weights), 0).flatten().slice(0, 0, extent_);
  return mask.nonzero().flatten().contiguous();
}

bool is_packed_index_set(const Sample& s, const std::string& key) {
  auto it = s.tensors.find(marker_key(key));
  if (it == s.tensors.end() || !s.has(key)) return false;
  auto m = read_marker(it->second, key);
  return m.is_ok() && m->kind == kPacked;
}

void put_packed_index_set(Sample& s, const std::string& key, at::Tensor packed) {
  s.tensors[key] = std::move(packed);
  s.tensors[marker_key(key)] = make_marker(kPacked, torch::kLong);
}

}  // namespace segflow::pipeline
