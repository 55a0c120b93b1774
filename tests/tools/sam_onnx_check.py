#!/usr/bin/env python3
"""Runs the two graphs `segflow export --to onnx` writes for a box-prompted SAM in onnxruntime.

    sam_onnx_check.py parity ENCODER.onnx:DECODER.onnx:IO.pt [...]
    sam_onnx_check.py infer MANIFEST.json IMAGE.nii.gz BOXES.json SEGFLOW_LABELS.nii.gz

parity: IO.pt is a dict saved by the C++ test: {"image", "boxes"} and segflow's eval-mode
{"image_embeddings", "low_res_masks"[, "iou_predictions"]}; prints one JSON list, per model
and output {model, output, shape, max_abs (segflow's), max_abs_diff (onnxruntime vs segflow)}.

infer: box-prompted inference driven only by the manifest: the image read with nibabel, the
manifest's deterministic stages applied (tests/tools/onnx_check.py's runner), and for each
voxel box of BOXES.json (segflow's box file, "space": "voxel") its slice repeated to three
channels and resized as the manifest says, the box mapped into the model's frame, the encoder
and decoder run, the low-resolution logits upsampled, sigmoid, threshold and the label merge;
compared voxel by voxel with `segflow infer --boxes`. Prints {voxels, agree, agreement,
box_pixels, box_agreement, foreground, segflow_foreground, seconds, network_s}: box_* over the
slices that hold a box; seconds from the manifest read to the label map (sessions included),
network_s in the two graphs' run calls (one embedding per slice, as segflow).
Exit 3 when onnxruntime cannot be imported, 2 for input this runner cannot follow.
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from onnx_check import preprocess, session
except ImportError as e:  # setup.sh installs onnxruntime
    print(f"sam_onnx_check.py: {e}", file=sys.stderr)
    sys.exit(3)


def check_parity(triples):
    out = []
    for triple in triples:
        enc_path, dec_path, io = triple.split(":")
        d = torch.load(io)
        enc, dec = session(enc_path), session(dec_path)
        emb = enc.run(["image_embeddings"], {"image": d["image"].numpy()})[0]
        names = [o.name for o in dec.get_outputs()]
        got = dict(zip(names, dec.run(names, {"image_embeddings": emb, "boxes": d["boxes"].numpy()})))
        got["image_embeddings"] = emb
        for name in ["image_embeddings", "low_res_masks", "iou_predictions"]:
            if name not in d:
                continue
            want = d[name].numpy()
            g = got.get(name)
            same = g is not None and g.shape == want.shape
            out.append({"model": os.path.basename(enc_path), "output": name, "shape": list(want.shape),
                        "max_abs": float(np.abs(want).max()),
                        "max_abs_diff": float(np.abs(g - want).max()) if same else float("inf")})
    print(json.dumps(out))


def model_box(b, h, w, size, longest):
    """segflow's voxel box (inclusive) in the model's input frame, as the manifest says."""
    if longest > 0:
        s = longest / max(h, w)
        return [b["x0"] * s, b["y0"] * s, b["x1"] * s, b["y1"] * s]
    sx, sy = size / w, size / h
    return [b["x0"] * sx, b["y0"] * sy, (b["x1"] + 1) * sx - 1, (b["y1"] + 1) * sy - 1]


def slice_input(x, size, longest):
    """(C, H, W) slice -> (1, 3, size, size) model input."""
    if x.shape[0] == 1:
        x = x.repeat(3, 1, 1)
    h, w = x.shape[1:]
    if longest > 0:
        nh, nw = int(h * longest / max(h, w) + 0.5), int(w * longest / max(h, w) + 0.5)
        x = F.interpolate(x[None], size=(nh, nw), mode="bilinear", align_corners=False)
        return F.pad(x, (0, size - nw, 0, size - nh))
    x = x[None]
    if (h, w) != (size, size):
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    return x


def run_infer(manifest_path, image_path, boxes_path, segflow_path):
    import nibabel as nib

    t0 = time.perf_counter()
    m = json.load(open(manifest_path))
    here = os.path.dirname(manifest_path)
    enc = session(os.path.join(here, m["model"]["encoder"]["file"]))
    dec = session(os.path.join(here, m["model"]["decoder"]["file"]))
    size, longest = m["model"]["image_size"], m["preprocessing"]["slice"]["resize_longest_side"]
    threshold = m["postprocessing"]["mask_threshold"]
    vol = np.asarray(nib.load(image_path).dataobj, dtype=np.float32).transpose(2, 1, 0)[None]
    vol = torch.from_numpy(preprocess(vol, m["preprocessing"]["stages"]))  # (C, Z, Y, X)
    boxes = json.load(open(boxes_path))
    if boxes.get("space", "voxel") != "voxel":
        print("sam_onnx_check.py: only voxel-space box files", file=sys.stderr)
        sys.exit(2)
    _, Z, H, W = vol.shape
    labels = np.zeros((Z, H, W), np.int64)
    best = np.zeros((Z, H, W), np.float32)
    network_s, cached_z, emb = 0.0, None, None
    for b in boxes["boxes"]:
        z = b["slice"]
        t1 = time.perf_counter()
        if z != cached_z:  # one embedding per slice, as segflow keeps the last one
            emb = enc.run(["image_embeddings"], {"image": slice_input(vol[:, z], size, longest).numpy()})[0]
            cached_z = z
        box = np.array([model_box(b, H, W, size, longest)], np.float32)
        low = torch.from_numpy(dec.run(["low_res_masks"], {"image_embeddings": emb, "boxes": box})[0])
        network_s += time.perf_counter() - t1
        if longest > 0:
            low = F.interpolate(low, size=(size, size), mode="bilinear", align_corners=False)
            nh, nw = int(H * longest / max(H, W) + 0.5), int(W * longest / max(H, W) + 0.5)
            low = low[:, :, :nh, :nw]
        p = torch.sigmoid(F.interpolate(low, size=(H, W), mode="bilinear", align_corners=False))[0, 0].numpy()
        take = (p > threshold) & (p > best[z])
        best[z][take] = p[take]
        labels[z][take] = b["label"]
    seconds = time.perf_counter() - t0
    ref = np.asarray(nib.load(segflow_path).dataobj).transpose(2, 1, 0).astype(np.int64)
    agree = int((labels == ref).sum())
    zs = sorted({b["slice"] for b in boxes["boxes"]})
    box_agree = int((labels[zs] == ref[zs]).sum())
    print(json.dumps({"voxels": int(ref.size), "agree": agree, "agreement": agree / ref.size,
                      "box_pixels": int(ref[zs].size), "box_agreement": box_agree / ref[zs].size,
                      "foreground": int((labels > 0).sum()), "segflow_foreground": int((ref > 0).sum()),
                      "seconds": round(seconds, 4), "network_s": round(network_s, 4)}))


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "parity":
        check_parity(sys.argv[2:])
    elif len(sys.argv) == 6 and sys.argv[1] == "infer":
        run_infer(*sys.argv[2:])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
