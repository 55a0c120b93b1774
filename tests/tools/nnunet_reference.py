#!/usr/bin/env python3
"""Reference outputs for segflow's nnU-Net stages (tests/pipeline/transforms/test_nnunet_stages.cpp).

usage: nnunet_reference.py JOB.json

JOB.json is a list of operations, each {"op": ..., "in": IN.npy, "out": OUT.npy, ...params}
on a float32 (C, Z, Y, X) or (C, Y, X) array; every output is written as float32 .npy.
NNUNET_REFERENCE_TRANSCRIBED=1 forces the transcriptions. Prints one JSON object {"references": {op: the code that computed it}} so a test can say
what it was checked against.

Where nnU-Net's own packages are installed in this Python (nnunetv2, batchgeneratorsv2),
their code is called with the given parameters; otherwise the same formulas, transcribed
from nnunetv2 2.x / batchgeneratorsv2 (numpy, scipy, torch):

  ct        nnunetv2 CTNormalization: clip to [lower, upper], (x - mean) / max(std, 1e-8),
            float32; lower/upper/mean/std are lists, one per channel
  zscore    nnunetv2 ZScoreNormalization per channel; nonzero: mask = create_nonzero_mask
            (any channel != 0, scipy binary_fill_holes), statistics and change inside it
  clip      per channel np.percentile (linear, float64) of the values (nonzero: of the
            non-zero ones), np.clip, optional linear rescale to [b_min, b_max]
  blur      scipy.ndimage.gaussian_filter per channel, sigma per spatial dim, mode reflect,
            truncate (not batchgeneratorsv2's, whose kernel and border differ: see the docs)
  gamma     batchgeneratorsv2 GammaTransform on one channel: gamma, invert, retain_stats
  contrast  batchgeneratorsv2 ContrastTransform on one channel: factor, preserve_range
  lowres    batchgeneratorsv2 SimulateLowResolutionTransform on one channel: zoom per dim
"""
import json
import os
import sys

import numpy as np


def have(module):
    try:
        __import__(module)
        return True
    except Exception:
        return False


# NNUNET_REFERENCE_TRANSCRIBED=1 uses the transcriptions even where the packages exist (to
# check them against the packages).
_TRANSCRIBED = os.environ.get("NNUNET_REFERENCE_TRANSCRIBED", "") not in ("", "0")
HAVE_NNUNET = not _TRANSCRIBED and have("nnunetv2")
HAVE_BGV2 = not _TRANSCRIBED and have("batchgeneratorsv2")


def op_ct(x, p):
    out = np.empty_like(x, dtype=np.float32)
    for c in range(x.shape[0]):
        props = {"mean": p["mean"][c], "std": p["std"][c], "percentile_00_5": p["lower"][c],
                 "percentile_99_5": p["upper"][c]}
        if HAVE_NNUNET:
            from nnunetv2.preprocessing.normalization.default_normalization_schemes import CTNormalization
            out[c] = CTNormalization(False, props).run(x[c].copy(), None)
        else:
            image = x[c].astype(np.float32, copy=True)
            np.clip(image, props["percentile_00_5"], props["percentile_99_5"], out=image)
            image -= props["mean"]
            image /= max(props["std"], 1e-8)
            out[c] = image
    return out, "nnunetv2 CTNormalization" if HAVE_NNUNET else "numpy transcription of CTNormalization"


def nonzero_mask(x):
    if HAVE_NNUNET:
        from nnunetv2.preprocessing.cropping.cropping import create_nonzero_mask
        return create_nonzero_mask(x)
    from scipy.ndimage import binary_fill_holes
    m = x[0] != 0
    for c in range(1, x.shape[0]):
        m |= x[c] != 0
    return binary_fill_holes(m)


def op_zscore(x, p):
    seg = np.where(nonzero_mask(x), 0, -1).astype(np.int8) if p["nonzero"] else None
    out = np.empty_like(x, dtype=np.float32)
    for c in range(x.shape[0]):
        if HAVE_NNUNET:
            from nnunetv2.preprocessing.normalization.default_normalization_schemes import ZScoreNormalization
            out[c] = ZScoreNormalization(bool(p["nonzero"]), {}).run(x[c].copy(), seg)
            continue
        image = x[c].astype(np.float32, copy=True)
        if seg is not None:
            mask = seg >= 0
            mean, std = image[mask].mean(), image[mask].std()
            image[mask] = (image[mask] - mean) / max(std, 1e-8)
        else:
            mean, std = image.mean(), image.std()
            image -= mean
            image /= max(std, 1e-8)
        out[c] = image
    return out, "nnunetv2 ZScoreNormalization" if HAVE_NNUNET else "numpy transcription of ZScoreNormalization"


def op_clip(x, p):
    out = np.empty_like(x, dtype=np.float32)
    for c in range(x.shape[0]):
        ch = x[c]
        sel = ch != 0 if p["nonzero"] else np.ones(ch.shape, bool)
        lo, hi = np.percentile(ch[sel].astype(np.float64), [p["lower"], p["upper"]])
        y = np.clip(ch.astype(np.float64), lo, hi)
        if p["rescale"]:
            y = (y - lo) / (hi - lo) * (p["b_max"] - p["b_min"]) + p["b_min"] if hi > lo else np.full_like(y, p["b_min"])
        out[c] = np.where(sel, y, ch)
    return out, "numpy.percentile (linear) and numpy.clip"


def op_blur(x, p):
    from scipy.ndimage import gaussian_filter
    out = np.empty_like(x, dtype=np.float32)
    for c in range(x.shape[0]):
        out[c] = gaussian_filter(x[c].astype(np.float64), sigma=p["sigma"], mode="reflect", truncate=p["truncate"])
    return out, "scipy.ndimage.gaussian_filter(mode='reflect')"


def bgv2_gamma(img, g, invert, retain):
    # batchgeneratorsv2.transforms.intensity.gamma.GammaTransform._apply_to_image, one channel.
    import torch
    x = img[0]
    if invert:
        x.mul_(-1)
    if retain:
        mean, std = x.mean(), x.std()
    minm, maxm = torch.aminmax(x)
    rnge = maxm - minm
    x.sub_(minm).div_(torch.clamp(rnge, min=1e-7)).pow_(g).mul_(rnge).add_(minm)
    if retain:
        x.sub_(x.mean()).mul_(std / torch.clamp(x.std(), min=1e-7)).add_(mean)
    if invert:
        x.mul_(-1)
    return img


def op_gamma(x, p):
    import torch
    img = torch.from_numpy(x[:1].astype(np.float32).copy())
    if HAVE_BGV2:
        from batchgeneratorsv2.transforms.intensity.gamma import GammaTransform
        t = GammaTransform((1, 1), 0, False, 1, 0)
        img = t._apply_to_image(img, apply_to_channel=torch.tensor([0]), retain_stats=torch.tensor([p["retain"]]),
                                invert_image=torch.tensor([p["invert"]]), gamma=torch.tensor([p["gamma"]]))
    else:
        img = bgv2_gamma(img, torch.tensor([p["gamma"]])[0], p["invert"], p["retain"])  # float32, as there
    return img.numpy(), "batchgeneratorsv2 GammaTransform" if HAVE_BGV2 else "transcription of batchgeneratorsv2 GammaTransform"


def op_contrast(x, p):
    import torch
    img = torch.from_numpy(x[:1].astype(np.float32).copy())
    if HAVE_BGV2:
        from batchgeneratorsv2.transforms.intensity.contrast import ContrastTransform
        t = ContrastTransform((1, 1), bool(p["preserve_range"]), False, 1)
        img = t._apply_to_image(img, apply_to_channel=torch.tensor([0]), multipliers=torch.tensor([p["factor"]]))
    else:
        ch = img[0]
        mean = ch.mean()
        minm, maxm = torch.aminmax(ch)
        ch.sub_(mean).mul_(p["factor"]).add_(mean)
        if p["preserve_range"]:
            ch.clamp_(minm, maxm)
    return img.numpy(), "batchgeneratorsv2 ContrastTransform" if HAVE_BGV2 else "transcription of batchgeneratorsv2 ContrastTransform"


def op_lowres(x, p):
    import torch
    from torch.nn.functional import interpolate
    img = torch.from_numpy(x[:1].astype(np.float32).copy())
    scales = torch.Tensor([p["zoom"]])
    if HAVE_BGV2:
        from batchgeneratorsv2.transforms.spatial.low_resolution import SimulateLowResolutionTransform
        t = SimulateLowResolutionTransform((1, 1), False, False, None)
        img = t._apply_to_image(img, apply_to_channel=torch.tensor([0]), scales=scales)
    else:
        orig_shape = img.shape[1:]
        new_shape = [round(i * j.item()) for i, j in zip(orig_shape, scales[0])]
        down = interpolate(img[0][None, None], new_shape, mode="nearest-exact")
        mode = {2: "bilinear", 3: "trilinear"}[img.ndim - 1]
        img[0] = interpolate(down, orig_shape, mode=mode)[0, 0]
    return img.numpy(), "batchgeneratorsv2 SimulateLowResolutionTransform" if HAVE_BGV2 else "transcription of batchgeneratorsv2 SimulateLowResolutionTransform (torch interpolate)"


OPS = {"ct": op_ct, "zscore": op_zscore, "clip": op_clip, "blur": op_blur, "gamma": op_gamma,
       "contrast": op_contrast, "lowres": op_lowres}


def main():
    with open(sys.argv[1]) as f:
        job = json.load(f)
    refs = {}
    for item in job:
        x = np.load(item["in"])
        out, ref = OPS[item["op"]](x, item)
        np.save(item["out"], np.ascontiguousarray(out, dtype=np.float32))
        refs[item["op"]] = ref
    print(json.dumps({"references": refs}))


if __name__ == "__main__":
    main()
