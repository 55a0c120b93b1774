#pragma once
// The compact form of cached samples (train.cache_dtype), and packed crop-centre sets.
//
// A deterministic sample is compacted once, after the deterministic stages and before it
// goes to the disk cache or the memory cache (host or device); the random stages see the
// original dtypes again. Each tensor of two or more dims (channel + space) gets the
// smallest of these forms, or stays as it is:
//   - cast (exact): integer-valued tensors (float or integer) whose values fit a narrower
//     integer type are held in the narrowest of uint8, int8, int16, int32 (a float tensor
//     holding -0.0 is not cast: the sign of zero would be lost);
//   - palette (exact): float32/float64 tensors with at most 65536 distinct values (bit
//     patterns) are held as uint8 (<= 256 values) or int16 codes plus a table of the values
//     (e.g. an integer CT windowed to [0, 1] without resampling: ~500 values);
//   - float16 / bfloat16 (lossy, only when cache_dtype asks for it): other floating
//     tensors, rounded to nearest. Tolerance of a restored value v of x: float16
//     |v - x| <= 2^-11 |x| + 2^-25 (tensors with |x| > 65504 stay float32); bfloat16
//     |v - x| <= 2^-8 |x|;
//   - float32 kept: the default for non-integer images (resampled, normalised), so that
//     crops are exactly those of the uncompacted path.
// fg_indices / bg_indices (int64 flat indices, pipeline/transforms/crop.hpp) become packed
// index sets: a bit per voxel of the grid plus one int64 running count per 512 voxels
// (about 0.27 byte per voxel for both sets, against 8 for int64 or 4 for int32 lists), read
// on the host by rand_crop_pos_neg, which picks the k-th index exactly as from the list.
//
// Representation inside a Sample (no new message type): for a compacted tensor `key`, a
// marker `~c:key` (int64 CPU tensor [kind, original dtype, code offset]) and, for a palette,
// its table `~t:key` (original dtype, on the same device as the codes). Markers and index
// sets stay in host memory wherever the cache lives (host_resident_key); tables and codes
// go to the cache device. expand_sample() undoes all of it.
//
// Who expands: rand_crop_pos_neg crops the compact tensors (fewer bytes to copy) and
// expands the crops; augment_case expands the whole sample first when the first random
// stage is another one (random stages other than rand_crop_pos_neg never see markers).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "messages/sample.hpp"
#include "messages/status.hpp"
#include "pipeline/fwd.hpp"

namespace segflow::pipeline {

/// How cached samples are held (train.cache_dtype).
enum class CacheDtype {
  exact,     ///< lossless compaction (cast, palette, packed index sets); the default
  float16,   ///< exact where possible, other floating tensors as float16
  bfloat16,  ///< exact where possible, other floating tensors as bfloat16
  none,      ///< as the deterministic stages made them (float32 image, int64 indices)
};

/// "exact" | "float16" | "bfloat16" | "none"; errors name `field`:
/// "loader: cache_dtype: expected exact, float16, bfloat16 or none, got \"fp8\"".
Result<CacheDtype> parse_cache_dtype(const std::string& text, const std::string& field = "cache_dtype");
/// The name parse_cache_dtype reads.
const char* cache_dtype_name(CacheDtype dtype);

/// Prefix of the marker of a compacted tensor ("~c:image").
inline constexpr const char* kCompactMarkerPrefix = "~c:";
/// Prefix of the value table of a palette tensor ("~t:image").
inline constexpr const char* kCompactTablePrefix = "~t:";

/// True for keys that stay in host memory wherever the cache lives: fg_indices, bg_indices,
/// fg_indices_<v> (is_crop_index_key; crop centres are picked on the host, so a CUDA cache
/// needs no device read per case) and compact markers.
bool host_resident_key(const std::string& key);

/// True when `s` holds compact tensors (any marker).
bool is_compact(const Sample& s);

/// True when the first random stage of `pipeline` reads compact samples itself
/// (rand_crop_pos_neg); otherwise augment_case expands before the random stages.
bool reads_compact(const Pipeline& pipeline);

/// The compact form of `s` (see the header comment). CPU tensors; a sample that is already
/// compact keeps its compact tensors. With CacheDtype::none, `s` unchanged.
Result<Sample> compact_sample(const Sample& s, CacheDtype dtype);

/// Undoes compact_sample on whatever device the tensors are: cast and palette tensors get
/// their original dtype and values (float16/bfloat16 ones their original dtype, rounded
/// values), packed index sets become int64 index lists on the host, markers and tables go.
/// A sample without markers is returned as it is.
Result<Sample> expand_sample(Sample s);

/// Spatial voxels of a sample: the largest numel / size(0) over its tensors of two or more
/// dims (markers, tables and index sets aside). For bytes-per-voxel figures.
std::int64_t sample_voxels(const Sample& s);

/// Packs a 1-D bool mask (true = in the set) of `mask.numel()` voxels.
at::Tensor pack_index_mask(const at::Tensor& mask);
/// Packs sorted, distinct int64 indices in [0, extent).
at::Tensor pack_index_list(const at::Tensor& indices, std::int64_t extent);

/// Read access to a packed index set (an int64 CPU tensor; layout in compact.cpp).
class PackedIndexSet {
 public:
  /// Checks the layout; a CUDA tensor is read back to the host first. Errors name `what`.
  static Result<PackedIndexSet> view(const at::Tensor& packed, const std::string& what);
  /// Number of indices in the set.
  std::int64_t size() const { return count_; }
  /// Every index is < extent() (the voxels of the grid the set was made on).
  std::int64_t extent() const { return extent_; }
  /// The k-th smallest index, 0 <= k < size(): O(log(extent / 512) + 8) word reads.
  std::int64_t select(std::int64_t k) const;
  /// All indices, sorted (int64, CPU).
  at::Tensor to_list() const;

 private:
  at::Tensor holder_;
  const std::uint64_t* words_ = nullptr;
  const std::int64_t* ranks_ = nullptr;
  std::int64_t extent_ = 0, count_ = 0, nwords_ = 0, nblocks_ = 0;
};

/// True when `s[key]` is a packed index set (its marker says so).
bool is_packed_index_set(const Sample& s, const std::string& key);
/// Stores `packed` under `key` with its marker.
void put_packed_index_set(Sample& s, const std::string& key, at::Tensor packed);

}  // namespace segflow::pipeline
