#!/usr/bin/env python3
"""Convert a PyTorch SAM / MedSAM checkpoint into a segflow tensor archive (.sfta).

segflow's C++ SAM (models/nets/sam.hpp) names its parameters exactly like segment_anything's
state dict (image_encoder.blocks.0.attn.qkv.weight, prompt_encoder.pe_layer.
positional_encoding_gaussian_matrix, mask_decoder.transformer.layers.0.self_attn.q_proj.weight,
...), so for SAM ViT-B and MedSAM checkpoints the name map is the identity. Other layouts are
handled with --strip-prefix (e.g. "module." from DDP or "sam." from wrappers), --rename
(regular-expression rules applied in order, Python re.sub syntax) and --drop.

Usage:
  convert_sam_weights.py medsam_vit_b.pth medsam_vit_b.sfta
  convert_sam_weights.py ckpt.pth out.sfta --strip-prefix module. \
      --rename '^sam\\.=' --rename 'mask_decoder\\.iou_head\\.=mask_decoder.iou_prediction_head.' \
      --drop '^optimizer\\.' --dtype float32
  convert_sam_weights.py ckpt.pth out.sfta --rename-file map.json   # {"regex": "replacement", ...}
  convert_sam_weights.py out.sfta --list                              # print an archive's tensors

The input is a state dict saved with torch.save, or a dict holding one under "model",
"state_dict" or "module". Loaded with weights_only=True (no code from the file runs).

Segflow tensor archive, version 1 (all integers little-endian):
  bytes [0, 8)      magic b"SFTARCH1"
  bytes [8, 16)     uint64 H, the length of the JSON header in bytes
  bytes [16, 16+H)  UTF-8 JSON: {"format": "segflow-tensor-archive", "version": 1,
                      "tensors": [{"name", "dtype", "shape", "offset", "nbytes"}, ...],
                      "metadata": {...}}
  bytes [16+H, end) data; tensor i at [16+H+offset_i, 16+H+offset_i+nbytes_i), raw
                    C-contiguous little-endian elements. Offsets are 64-byte aligned (zero
                    padding) and the header is space-padded so the data starts aligned.
  dtype: float32 float64 float16 bfloat16 int64 int32 int16 int8 uint8 bool;
  nbytes = prod(shape) * element size.
The C++ reader is segflow::models::read_tensor_archive (models/nets/weights.hpp).
"""

from __future__ import annotations

import argparse
import json
import re
import struct
import sys

MAGIC = b"SFTARCH1"
ALIGN = 64


def _dtype_names():
    import torch

    return {
        torch.float32: "float32",
        torch.float64: "float64",
        torch.float16: "float16",
        torch.bfloat16: "bfloat16",
        torch.int64: "int64",
        torch.int32: "int32",
        torch.int16: "int16",
        torch.int8: "int8",
        torch.uint8: "uint8",
        torch.bool: "bool",
    }


def load_state_dict(path):
    import torch

    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise SystemExit(f"{path}: not a loadable PyTorch checkpoint ({type(e).__name__}: {first})")
    if isinstance(obj, dict):
        for key in ("model", "state_dict", "module"):
            if key in obj and isinstance(obj[key], dict):
                obj = obj[key]
                break
    if not isinstance(obj, dict):
        raise SystemExit(f"{path}: expected a state dict (a dict of tensors), got {type(obj).__name__}")
    out = {}
    for name, value in obj.items():
        if isinstance(value, torch.Tensor):
            out[str(name)] = value
    if not out:
        raise SystemExit(f"{path}: no tensors found")
    return out


def rename_all(tensors, strip_prefixes, rules, drops):
    out = {}
    for name, t in tensors.items():
        if any(re.search(d, name) for d in drops):
            continue
        new = name
        for p in strip_prefixes:
            if new.startswith(p):
                new = new[len(p):]
        for pattern, repl in rules:
            new = re.sub(pattern, repl, new)
        if new in out:
            raise SystemExit(f"two tensors map to the name {new!r} (the second was {name!r})")
        out[new] = t
    return out


def write_archive(path, tensors, metadata=None):
    import torch

    names = _dtype_names()
    entries, blobs, offset = [], [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        if t.dtype not in names:
            raise SystemExit(f"{name}: unsupported dtype {t.dtype}")
        if t.dtype == torch.bfloat16:
            raw = t.view(torch.int16).numpy().astype("<i2").tobytes()
        else:
            arr = t.numpy()
            raw = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
        entries.append({"name": name, "dtype": names[t.dtype], "shape": list(t.shape), "offset": offset,
                        "nbytes": len(raw)})
        blobs.append(raw)
        offset += (len(raw) + ALIGN - 1) // ALIGN * ALIGN
    header = {"format": "segflow-tensor-archive", "version": 1, "tensors": entries}
    if metadata:
        header["metadata"] = metadata
    h = json.dumps(header).encode("utf-8")
    h += b" " * ((ALIGN - (16 + len(h)) % ALIGN) % ALIGN)
    tmp = str(path) + ".tmp"
    with open(tmp, "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for raw in blobs:
            f.write(raw)
            f.write(b"\0" * ((ALIGN - len(raw) % ALIGN) % ALIGN))
    import os

    os.replace(tmp, path)


def read_header(path):
    with open(path, "rb") as f:
        if f.read(8) != MAGIC:
            raise SystemExit(f"{path}: not a segflow tensor archive")
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n).decode("utf-8"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("input", help="checkpoint (.pth) or, with --list, an archive")
    ap.add_argument("output", nargs="?", help="archive to write (.sfta)")
    ap.add_argument("--strip-prefix", action="append", default=[], metavar="PREFIX",
                    help="remove PREFIX from the start of names (repeatable)")
    ap.add_argument("--rename", action="append", default=[], metavar="REGEX=REPLACEMENT",
                    help="re.sub rule applied to every name, in order (repeatable)")
    ap.add_argument("--rename-file", metavar="JSON", help='JSON object {"regex": "replacement", ...}')
    ap.add_argument("--drop", action="append", default=[], metavar="REGEX", help="skip tensors whose original name matches REGEX (repeatable)")
    ap.add_argument("--dtype", choices=["keep", "float32", "float16", "bfloat16"], default="keep",
                    help="convert floating-point tensors")
    ap.add_argument("--list", action="store_true", help="print the tensors of an archive and exit")
    args = ap.parse_args(argv)

    if args.list:
        for e in read_header(args.input)["tensors"]:
            print(f'{e["name"]}\t{e["dtype"]}\t{e["shape"]}')
        return 0
    if not args.output:
        ap.error("output is required")

    rules = []
    for r in args.rename:
        if "=" not in r:
            ap.error(f"--rename {r!r}: expected REGEX=REPLACEMENT")
        pattern, repl = r.split("=", 1)
        rules.append((pattern, repl))
    if args.rename_file:
        with open(args.rename_file) as f:
            for pattern, repl in json.load(f).items():
                rules.append((pattern, repl))

    import torch

    tensors = rename_all(load_state_dict(args.input), args.strip_prefix, rules, args.drop)
    if args.dtype != "keep":
        target = getattr(torch, args.dtype)
        tensors = {k: (v.to(target) if v.is_floating_point() else v) for k, v in tensors.items()}
    write_archive(args.output, tensors, {"source": str(args.input), "converter": "convert_sam_weights.py"})
    print(f"wrote {len(tensors)} tensors to {args.output}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit:
        raise
    except Exception as e:  # one clear line instead of a traceback
        first = (str(e).strip().splitlines() or [""])[0]
        print(f"convert_sam_weights.py: error: {type(e).__name__}: {first}", file=sys.stderr)
        sys.exit(1)
