#!/usr/bin/env python3
"""Runs what `segflow export --to onnx` wrote in onnxruntime, the independent runtime.

    onnx_check.py logits MODEL.onnx:IO.pt [MODEL.onnx:IO.pt ...]
    onnx_check.py infer MANIFEST.json IMAGE.nii.gz SEGFLOW_LABELS.nii.gz

logits: IO.pt is a dict saved by the C++ test, {"x": input, "y": segflow's eval-mode
logits}; prints one JSON list, per model {model, max_abs (of segflow's logits),
max_abs_diff (onnxruntime vs segflow), shape}.

infer: a sliding-window prediction driven only by the manifest: the image read with nibabel,
the manifest's deterministic stages applied (this runner implements the stages that change
intensities without moving voxels: scale_intensity_range, and the ones that leave the image
alone: load, fg_bg_indices, map_labels; any other stage is refused by name), MONAI's
sliding_window_inference with the manifest's window, overlap, blending and sigma, the ONNX
model as predictor with the manifest's activation, and the argmax; compared voxel by voxel
with segflow infer's label map. Prints {voxels, agree, agreement, labels}.
Exit 3 when onnxruntime or MONAI cannot be imported, 2 for a manifest this runner cannot follow.
"""
import json
import os
import sys

try:
    import numpy as np
    import onnxruntime as ort
    import torch
except ImportError as e:  # setup.sh installs them
    print(f"onnx_check.py: {e}", file=sys.stderr)
    sys.exit(3)


def session(path):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = int(os.environ.get("ORT_THREADS", "1"))
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def check_logits(pairs):
    out = []
    for pair in pairs:
        model, io = pair.rsplit(":", 1)
        d = torch.load(io)
        x, y = d["x"].numpy(), d["y"].numpy()
        got = session(model).run(["logits"], {"image": x})[0]
        out.append({"model": os.path.basename(model), "shape": list(got.shape),
                    "max_abs": float(np.abs(y).max()),
                    "max_abs_diff": float(np.abs(got - y).max()) if got.shape == y.shape else float("inf")})
    print(json.dumps(out))


NO_OP_STAGES = {"load", "fg_bg_indices", "map_labels"}


def preprocess(image, stages):
    """image (C, Z, Y, X) float32 through the manifest's deterministic stages."""
    for st in stages:
        name, o = st["name"], st.get("options", {})
        if name in NO_OP_STAGES:
            continue
        if name == "scale_intensity_range":
            if "image" not in o.get("keys", ["image"]):
                continue
            a0, a1, b0, b1 = o["a_min"], o["a_max"], o["b_min"], o["b_max"]
            image = (image - a0) / (a1 - a0) * (b1 - b0) + b0
            if o.get("clip", False):
                image = np.clip(image, min(b0, b1), max(b0, b1))
            continue
        print(f"onnx_check.py: stage '{name}' is not implemented by this reference runner", file=sys.stderr)
        sys.exit(2)
    return image.astype(np.float32)


def run_infer(manifest_path, image_path, segflow_path):
    import nibabel as nib
    from monai.inferers import sliding_window_inference

    m = json.load(open(manifest_path))
    sess = session(os.path.join(os.path.dirname(manifest_path), m["model"]["file"]))
    # nibabel gives (x, y, z); segflow's tensors are (C, Z, Y, X).
    vol = np.asarray(nib.load(image_path).dataobj, dtype=np.float32).transpose(2, 1, 0)[None]
    x = torch.from_numpy(preprocess(vol, m["preprocessing"]["stages"]))[None]
    inf = m["inference"]
    roi = list(reversed(inf["roi_size"])) if inf["roi_size"] else list(x.shape[2:])
    sigmoid = inf["activation"] == "sigmoid"

    def predictor(w):
        logits = torch.from_numpy(sess.run(["logits"], {"image": w.numpy()})[0])
        if sigmoid:
            p = torch.sigmoid(logits)
            return torch.cat([1 - p, p], 1)
        return torch.softmax(logits, 1)

    with torch.no_grad():
        probs = sliding_window_inference(x, roi, inf["sw_batch_size"], predictor, overlap=inf["overlap"],
                                         mode=inf["blend"], sigma_scale=inf["sigma_scale"],
                                         padding_mode="constant", cval=inf["padding_value"])
    labels = probs[0].argmax(0).numpy()
    ref = np.asarray(nib.load(segflow_path).dataobj).transpose(2, 1, 0)
    agree = int((labels == ref).sum())
    print(json.dumps({"voxels": int(ref.size), "agree": agree, "agreement": agree / ref.size,
                      "labels": sorted(int(v) for v in np.unique(labels))}))


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "logits":
        check_logits(sys.argv[2:])
    elif len(sys.argv) == 5 and sys.argv[1] == "infer":
        run_infer(*sys.argv[2:])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
