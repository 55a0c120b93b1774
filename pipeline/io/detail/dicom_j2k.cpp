// JPEG 2000 pixel data (transfer syntaxes 1.2.840.10008.1.2.4.90 lossless and .91 lossy)
// decoded by OpenJPEG behind DCMTK's codec interface: once registered, DCMTK's
// chooseRepresentation() and DicomImage treat JPEG 2000 like any other compressed syntax,
// so the reader's rescale, signedness (PixelRepresentation, BitsStored) and multi-frame
// handling are the same for every syntax.
#include <dcmtk/config/osconfig.h>  // must come first among DCMTK headers
#include <dcmtk/dcmdata/dccodec.h>
#include <dcmtk/dcmdata/dcdatset.h>
#include <dcmtk/dcmdata/dcdeftag.h>
#include <dcmtk/dcmdata/dcitem.h>
#include <dcmtk/dcmdata/dcpixseq.h>
#include <dcmtk/dcmdata/dcpxitem.h>
#include <dcmtk/dcmdata/dcswap.h>
#include <dcmtk/dcmdata/dcvrpobw.h>
#include <dcmtk/dcmdata/dcxfer.h>

#include <openjpeg.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "pipeline/io/detail/dicom_common.hpp"

namespace segflow::pipeline::detail {

namespace {

// A private module number for the conditions this codec returns (DCMTK's own modules use
// small numbers; see ofcond.h).
constexpr unsigned short kModule = 0x5E6F;

OFCondition failure(const std::string& text) { return OFCondition(kModule, 1, OF_error, text.c_str()); }

/// The image attributes the decoder needs, from the dataset that holds the pixel data.
struct ImageAttributes {
  Uint16 rows = 0, columns = 0, samples = 1, bits_allocated = 0, bits_stored = 0, pixel_representation = 0;
  Sint32 frames = 1;
  std::string photometric;
};

/// Reads the attributes or says which one is missing or unusable.
std::string read_attributes(DcmItem& ds, ImageAttributes& a) {
  auto need = [&](const DcmTagKey& tag, Uint16& v) -> std::string {
    if (ds.findAndGetUint16(tag, v).bad()) return tag_name(tag) + ": required tag is missing";
    return {};
  };
  for (auto [tag, v] :
       {std::pair{DCM_Rows, &a.rows}, {DCM_Columns, &a.columns}, {DCM_BitsAllocated, &a.bits_allocated}})
    if (auto e = need(tag, *v); !e.empty()) return e;
  if (ds.findAndGetUint16(DCM_SamplesPerPixel, a.samples).bad()) a.samples = 1;
  if (ds.findAndGetUint16(DCM_BitsStored, a.bits_stored).bad()) a.bits_stored = a.bits_allocated;
  if (ds.findAndGetUint16(DCM_PixelRepresentation, a.pixel_representation).bad()) a.pixel_representation = 0;
  Sint32 frames = 1;
  if (ds.findAndGetSint32(DCM_NumberOfFrames, frames).good() && frames > 0) a.frames = frames;
  OFString pi;
  if (ds.findAndGetOFString(DCM_PhotometricInterpretation, pi).good()) a.photometric = pi.c_str();
  if (a.rows == 0 || a.columns == 0)
    return "Rows x Columns: expected positive numbers, got " + std::to_string(a.rows) + " x " +
           std::to_string(a.columns);
  if (a.bits_allocated != 8 && a.bits_allocated != 16 && a.bits_allocated != 32)
    return tag_name(DCM_BitsAllocated) + ": expected 8, 16 or 32 for JPEG 2000, got " +
           std::to_string(a.bits_allocated);
  if (a.samples != 1 && a.samples != 3)
    return tag_name(DCM_SamplesPerPixel) + ": expected 1 or 3, got " + std::to_string(a.samples);
  return {};
}

/// Bytes of one fragment (loaded from disk on first access).
bool fragment_bytes(DcmPixelSequence& seq, unsigned long index, const Uint8*& data, Uint32& size) {
  DcmPixelItem* item = nullptr;
  if (seq.getItem(item, index).bad() || !item) return false;
  size = item->getLength();
  Uint8* p = nullptr;
  if (size > 0 && (item->getUint8Array(p).bad() || !p)) return false;
  data = p;
  return true;
}

bool starts_codestream(const Uint8* d, Uint32 n) {
  // SOC (FF 4F) then SIZ (FF 51): the first bytes of a J2K codestream; or a JP2 signature box.
  static const Uint8 jp2[] = {0x00, 0x00, 0x00, 0x0C, 0x6A, 0x50, 0x20, 0x20};
  return (n >= 4 && d[0] == 0xFF && d[1] == 0x4F && d[2] == 0xFF && d[3] == 0x51) ||
         (n >= 8 && std::memcmp(d, jp2, 8) == 0);
}

/// The fragments [first, last) of each frame (item 0 is the Basic Offset Table).
std::string split_frames(DcmPixelSequence& seq, Sint32 frames,
                         std::vector<std::pair<unsigned long, unsigned long>>& out) {
  const unsigned long items = seq.card();
  if (items < 2) return "the pixel sequence holds no fragment";
  const unsigned long fragments = items - 1;
  const auto nf = static_cast<unsigned long>(frames);
  out.clear();
  if (nf == 1) {
    out.emplace_back(1, items);
    return {};
  }
  if (fragments == nf) {
    for (unsigned long f = 0; f < nf; ++f) out.emplace_back(f + 1, f + 2);
    return {};
  }
  // The Basic Offset Table: one byte offset per frame, from the first fragment's item tag.
  const Uint8* bot = nullptr;
  Uint32 bot_size = 0;
  if (fragment_bytes(seq, 0, bot, bot_size) && bot_size == 4 * nf) {
    std::vector<Uint32> offsets(nf);
    std::memcpy(offsets.data(), bot, bot_size);
    swapIfNecessary(gLocalByteOrder, EBO_LittleEndian, offsets.data(), bot_size, sizeof(Uint32));
    std::vector<unsigned long> starts;
    Uint32 pos = 0;
    unsigned long f = 0;
    for (unsigned long i = 1; i < items && f < nf; ++i) {
      DcmPixelItem* item = nullptr;
      if (seq.getItem(item, i).bad() || !item) break;
      if (pos == offsets[f]) {
        starts.push_back(i);
        ++f;
      } else if (pos > offsets[f]) {
        break;
      }
      pos += 8 + item->getLength();
    }
    if (starts.size() == nf) {
      for (unsigned long k = 0; k < nf; ++k) out.emplace_back(starts[k], k + 1 < nf ? starts[k + 1] : items);
      return {};
    }
  }
  // No usable offset table: a frame starts at each fragment that starts a codestream.
  std::vector<unsigned long> starts;
  for (unsigned long i = 1; i < items; ++i) {
    const Uint8* d = nullptr;
    Uint32 n = 0;
    if (!fragment_bytes(seq, i, d, n)) return "cannot read fragment " + std::to_string(i);
    if (starts_codestream(d, n)) starts.push_back(i);
  }
  if (starts.size() != nf || starts.front() != 1)
    return "cannot split " + std::to_string(fragments) + " fragments into " + std::to_string(nf) +
           " frames (NumberOfFrames): no Basic Offset Table and " + std::to_string(starts.size()) +
           " fragments start a JPEG 2000 codestream";
  for (unsigned long k = 0; k < nf; ++k) out.emplace_back(starts[k], k + 1 < nf ? starts[k + 1] : items);
  return {};
}

// ---- OpenJPEG from memory -------------------------------------------------------------

struct MemoryStream {
  const Uint8* data = nullptr;
  OPJ_SIZE_T size = 0;
  OPJ_SIZE_T pos = 0;
};

OPJ_SIZE_T stream_read(void* buffer, OPJ_SIZE_T n, void* user) {
  auto* m = static_cast<MemoryStream*>(user);
  if (m->pos >= m->size) return static_cast<OPJ_SIZE_T>(-1);
  n = std::min(n, m->size - m->pos);
  std::memcpy(buffer, m->data + m->pos, n);
  m->pos += n;
  return n;
}

OPJ_OFF_T stream_skip(OPJ_OFF_T n, void* user) {
  auto* m = static_cast<MemoryStream*>(user);
  if (n < 0) {
    n = std::max<OPJ_OFF_T>(n, -static_cast<OPJ_OFF_T>(m->pos));
  } else {
    n = std::min<OPJ_OFF_T>(n, static_cast<OPJ_OFF_T>(m->size - m->pos));
  }
  m->pos = static_cast<OPJ_SIZE_T>(static_cast<OPJ_OFF_T>(m->pos) + n);
  return n;
}

OPJ_BOOL stream_seek(OPJ_OFF_T n, void* user) {
  auto* m = static_cast<MemoryStream*>(user);
  if (n < 0 || static_cast<OPJ_SIZE_T>(n) > m->size) return OPJ_FALSE;
  m->pos = static_cast<OPJ_SIZE_T>(n);
  return OPJ_TRUE;
}

/// OpenJPEG's error messages, joined into one line.
void collect_message(const char* msg, void* user) {
  auto* out = static_cast<std::string*>(user);
  std::string s(msg ? msg : "");
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  if (s.empty()) return;
  if (!out->empty()) *out += "; ";
  *out += s;
}
void ignore_message(const char*, void*) {}

struct CodecDeleter {
  void operator()(opj_codec_t* c) const { opj_destroy_codec(c); }
};
struct StreamDeleter {
  void operator()(opj_stream_t* s) const { opj_stream_destroy(s); }
};
struct ImageDeleter {
  void operator()(opj_image_t* i) const { opj_image_destroy(i); }
};

/// Decodes one codestream into `out` (rows x columns x samples, interleaved, bytes per
/// sample from BitsAllocated, little endian). Returns an empty string or what went wrong.
std::string decode_codestream(const Uint8* data, std::size_t size, const ImageAttributes& a, Uint8* out) {
  if (size < 8) return "the codestream is " + std::to_string(size) + " bytes long";
  const bool jp2 = !(data[0] == 0xFF && data[1] == 0x4F);
  if (!starts_codestream(data, static_cast<Uint32>(std::min<std::size_t>(size, 0xFFFFFFFFu)))) {
    char got[16];
    std::snprintf(got, sizeof got, "%02X %02X %02X %02X", data[0], data[1], data[2], data[3]);
    return std::string("expected a JPEG 2000 codestream (FF 4F FF 51) or a JP2 file, got bytes ") + got;
  }
  std::unique_ptr<opj_codec_t, CodecDeleter> codec(
      opj_create_decompress(jp2 ? OPJ_CODEC_JP2 : OPJ_CODEC_J2K));
  if (!codec) return "OpenJPEG could not create a decoder";
  std::string errors;
  opj_set_error_handler(codec.get(), collect_message, &errors);
  opj_set_warning_handler(codec.get(), ignore_message, nullptr);
  opj_set_info_handler(codec.get(), ignore_message, nullptr);
  opj_dparameters_t params;
  opj_set_default_decoder_parameters(&params);
  if (!opj_setup_decoder(codec.get(), &params)) return "OpenJPEG: cannot set up the decoder: " + errors;
  // Strict mode: a truncated codestream is an error, not a partially decoded image.
  opj_decoder_set_strict_mode(codec.get(), OPJ_TRUE);

  MemoryStream mem{data, size, 0};
  std::unique_ptr<opj_stream_t, StreamDeleter> stream(opj_stream_create(OPJ_J2K_STREAM_CHUNK_SIZE, OPJ_TRUE));
  if (!stream) return "OpenJPEG could not create a stream";
  opj_stream_set_user_data(stream.get(), &mem, nullptr);
  opj_stream_set_user_data_length(stream.get(), size);
  opj_stream_set_read_function(stream.get(), stream_read);
  opj_stream_set_skip_function(stream.get(), stream_skip);
  opj_stream_set_seek_function(stream.get(), stream_seek);

  opj_image_t* raw = nullptr;
  if (!opj_read_header(stream.get(), codec.get(), &raw)) {
    opj_image_destroy(raw);
    return "OpenJPEG: " + (errors.empty() ? std::string("cannot read the header") : errors);
  }
  std::unique_ptr<opj_image_t, ImageDeleter> image(raw);
  if (!opj_decode(codec.get(), stream.get(), image.get()) || !opj_end_decompress(codec.get(), stream.get()))
    return "OpenJPEG: " + (errors.empty() ? std::string("decoding failed") : errors);

  const std::size_t rows = a.rows, cols = a.columns, spp = a.samples;
  if (image->numcomps != spp)
    return "expected " + std::to_string(spp) + " components (SamplesPerPixel), the codestream has " +
           std::to_string(image->numcomps);
  for (OPJ_UINT32 c = 0; c < image->numcomps; ++c) {
    const opj_image_comp_t& comp = image->comps[c];
    if (comp.w != cols || comp.h != rows)
      return "expected " + std::to_string(rows) + " x " + std::to_string(cols) +
             " (Rows x Columns), component " + std::to_string(c) + " of the codestream is " +
             std::to_string(comp.h) + " x " + std::to_string(comp.w);
    if (comp.dx != 1 || comp.dy != 1) return "subsampled components are not supported";
    if (comp.prec > a.bits_allocated)
      return "component precision " + std::to_string(comp.prec) + " bits does not fit BitsAllocated " +
             std::to_string(a.bits_allocated);
    if (!comp.data) return "OpenJPEG returned no samples";
  }
  // The low BitsAllocated bits of each sample: DCMTK reads them with PixelRepresentation and
  // BitsStored, so a signedness that differs between codestream and dataset resolves the way
  // pydicom and GDCM resolve it (the dataset's PixelRepresentation wins).
  const std::size_t n = rows * cols;
  switch (a.bits_allocated) {
    case 8:
      for (std::size_t c = 0; c < spp; ++c) {
        const OPJ_INT32* src = image->comps[c].data;
        for (std::size_t i = 0; i < n; ++i) out[i * spp + c] = static_cast<Uint8>(src[i]);
      }
      break;
    case 16:
      for (std::size_t c = 0; c < spp; ++c) {
        const OPJ_INT32* src = image->comps[c].data;
        for (std::size_t i = 0; i < n; ++i) {
          const auto v = static_cast<Uint16>(static_cast<std::uint32_t>(src[i]) & 0xFFFFu);
          out[2 * (i * spp + c)] = static_cast<Uint8>(v & 0xFF);
          out[2 * (i * spp + c) + 1] = static_cast<Uint8>(v >> 8);
        }
      }
      break;
    default:
      for (std::size_t c = 0; c < spp; ++c) {
        const OPJ_INT32* src = image->comps[c].data;
        for (std::size_t i = 0; i < n; ++i) {
          const auto v = static_cast<std::uint32_t>(src[i]);
          for (int b = 0; b < 4; ++b) out[4 * (i * spp + c) + b] = static_cast<Uint8>(v >> (8 * b));
        }
      }
      break;
  }
  return {};
}

/// Decodes frame `f` (fragments [first, last)) into `out`; an empty string or the error.
std::string decode_frame(DcmPixelSequence& seq, unsigned long first, unsigned long last,
                         const ImageAttributes& a, Uint8* out) {
  const Uint8* data = nullptr;
  Uint32 size = 0;
  std::vector<Uint8> joined;
  if (last - first == 1) {
    if (!fragment_bytes(seq, first, data, size)) return "cannot read fragment " + std::to_string(first);
  } else {
    for (unsigned long i = first; i < last; ++i) {
      const Uint8* d = nullptr;
      Uint32 n = 0;
      if (!fragment_bytes(seq, i, d, n)) return "cannot read fragment " + std::to_string(i);
      joined.insert(joined.end(), d, d + n);
    }
    data = joined.data();
    size = static_cast<Uint32>(joined.size());
  }
  if (!data || size == 0) return "the frame's codestream is empty";
  return decode_codestream(data, size, a, out);
}

std::string frame_label(Sint32 f, Sint32 frames) {
  return "JPEG 2000 frame " + std::to_string(f + 1) + " of " + std::to_string(frames);
}

/// The colour model of decoded samples: OpenJPEG undoes the reversible (RCT) and
/// irreversible (ICT) component transforms, so YBR_RCT and YBR_ICT come out as RGB.
std::string decoded_photometric(const std::string& pi) {
  return pi == "YBR_RCT" || pi == "YBR_ICT" ? std::string("RGB") : pi;
}

class J2kDecoder : public DcmCodec {
 public:
  OFBool canChangeCoding(const E_TransferSyntax from, const E_TransferSyntax to) const override {
    return (from == EXS_JPEG2000LosslessOnly || from == EXS_JPEG2000) && DcmXfer(to).isNotEncapsulated();
  }

  OFCondition decode(const DcmRepresentationParameter*, DcmPixelSequence* seq, DcmPolymorphOBOW& pixels,
                     const DcmCodecParameter*, const DcmStack& objStack,
                     OFBool& removeOldRep) const override {
    DcmStack stack(objStack);
    (void)stack.pop();  // the pixel data element
    DcmObject* parent = stack.pop();
    if (!parent || (parent->ident() != EVR_dataset && parent->ident() != EVR_item) || !seq)
      return failure("JPEG 2000: pixel data outside a dataset");
    DcmItem& ds = *static_cast<DcmItem*>(parent);
    ImageAttributes a;
    if (auto e = read_attributes(ds, a); !e.empty()) return failure("JPEG 2000: " + e);
    std::vector<std::pair<unsigned long, unsigned long>> frames;
    if (auto e = split_frames(*seq, a.frames, frames); !e.empty()) return failure("JPEG 2000: " + e);
    const std::uint64_t frame_bytes = std::uint64_t{a.rows} * a.columns * a.samples * (a.bits_allocated / 8);
    std::uint64_t total = frame_bytes * static_cast<std::uint64_t>(a.frames);
    if (total & 1) ++total;
    if (total >= 0xFFFFFFFEull) return failure("JPEG 2000: the decoded pixel data would exceed 4 GiB");
    Uint16* words = nullptr;
    OFCondition c = pixels.createUint16Array(static_cast<Uint32>(total / 2), words);
    if (c.bad()) return c;
    auto* bytes = reinterpret_cast<Uint8*>(words);
    if (total > frame_bytes * static_cast<std::uint64_t>(a.frames)) bytes[total - 1] = 0;
    for (Sint32 f = 0; f < a.frames; ++f) {
      const auto& [first, last] = frames[static_cast<std::size_t>(f)];
      if (auto e = decode_frame(*seq, first, last, a, bytes + frame_bytes * static_cast<std::uint64_t>(f));
          !e.empty())
        return failure(frame_label(f, a.frames) + ": " + e);
    }
    // The buffer holds little-endian samples; DCMTK keeps OW data in the local byte order.
    if (a.bits_allocated > 8) {
      c = swapIfNecessary(gLocalByteOrder, EBO_LittleEndian, words, static_cast<Uint32>(total),
                          a.bits_allocated / 8);
    } else {
      c = swapIfNecessary(gLocalByteOrder, EBO_LittleEndian, words, static_cast<Uint32>(total),
                          sizeof(Uint16));
    }
    if (c.bad()) return c;
    if (const std::string pi = decoded_photometric(a.photometric); pi != a.photometric) {
      ds.putAndInsertString(DCM_PhotometricInterpretation, pi.c_str());
      removeOldRep = OFTrue;
    }
    if (a.samples > 1) ds.putAndInsertUint16(DCM_PlanarConfiguration, 0);
    return EC_Normal;
  }

  OFCondition decodeFrame(const DcmRepresentationParameter*, DcmPixelSequence* seq, const DcmCodecParameter*,
                          DcmItem* ds, Uint32 frameNo, Uint32& startFragment, void* buffer, Uint32 bufSize,
                          OFString& colorModel) const override {
    if (!ds || !seq) return failure("JPEG 2000: pixel data outside a dataset");
    ImageAttributes a;
    if (auto e = read_attributes(*ds, a); !e.empty()) return failure("JPEG 2000: " + e);
    if (frameNo >= static_cast<Uint32>(a.frames))
      return failure("JPEG 2000: frame " + std::to_string(frameNo + 1) + " requested, the image has " +
                     std::to_string(a.frames));
    const std::uint64_t frame_bytes = std::uint64_t{a.rows} * a.columns * a.samples * (a.bits_allocated / 8);
    if (bufSize < frame_bytes) return failure("JPEG 2000: frame buffer too small");
    std::vector<std::pair<unsigned long, unsigned long>> frames;
    if (auto e = split_frames(*seq, a.frames, frames); !e.empty()) return failure("JPEG 2000: " + e);
    const auto& [first, last] = frames[frameNo];
    if (auto e = decode_frame(*seq, first, last, a, static_cast<Uint8*>(buffer)); !e.empty())
      return failure(frame_label(static_cast<Sint32>(frameNo), a.frames) + ": " + e);
    if (a.bits_allocated > 8)
      swapIfNecessary(gLocalByteOrder, EBO_LittleEndian, buffer, static_cast<Uint32>(frame_bytes),
                      a.bits_allocated / 8);
    startFragment = static_cast<Uint32>(last);
    colorModel = decoded_photometric(a.photometric).c_str();
    return EC_Normal;
  }

  OFCondition encode(const Uint16*, const Uint32, const DcmRepresentationParameter*, DcmPixelSequence*&,
                     const DcmCodecParameter*, DcmStack&, OFBool&) const override {
    return EC_IllegalCall;  // decoder only
  }
  OFCondition encode(const E_TransferSyntax, const DcmRepresentationParameter*, DcmPixelSequence*,
                     const DcmRepresentationParameter*, DcmPixelSequence*&, const DcmCodecParameter*,
                     DcmStack&, OFBool&) const override {
    return EC_IllegalCall;
  }

  OFCondition determineDecompressedColorModel(const DcmRepresentationParameter*, DcmPixelSequence*,
                                              const DcmCodecParameter*, DcmItem* ds,
                                              OFString& colorModel) const override {
    if (!ds) return EC_IllegalParameter;
    OFString pi;
    OFCondition c = ds->findAndGetOFString(DCM_PhotometricInterpretation, pi);
    if (c.good()) colorModel = decoded_photometric(pi.c_str()).c_str();
    return c;
  }
};

class J2kParameter : public DcmCodecParameter {
 public:
  DcmCodecParameter* clone() const override { return new J2kParameter(*this); }
  const char* className() const override { return "segflow::J2kParameter"; }
};

}  // namespace

void register_j2k_decoder() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Lives as long as the process: DCMTK keeps the pointers in its codec list.
    static J2kDecoder decoder;
    static J2kParameter parameter;
    DcmCodecList::registerCodec(&decoder, nullptr, &parameter);
  });
}

}  // namespace segflow::pipeline::detail
