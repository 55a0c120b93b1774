#!/usr/bin/env python3
"""Reference side of segflow's full-size SAM parity test (tests/models/test_sam_parity.cpp).

segment_anything 1.0's own ViT-B (sam_model_registry["vit_b"]()), randomly initialised with a
fixed seed, is the peer. Every output is written as a segflow tensor archive (.sfta, written
by scripts/convert_sam_weights.py's write_archive) for the C++ side to read.

  sam_parity.py weights OUT_DIR [--seed N]
      OUT_DIR/sam_vit_b.pth      segment_anything's state dict (torch.save). Parameters that
                                 SAM initialises to constants (pos_embed and the relative
                                 position tables are zeros, LayerNorm weights ones and biases
                                 zeros) get seeded noise, so that every one of them matters.
      OUT_DIR/medsam_style.pth   the same tensors as a MedSAM-style training checkpoint:
                                 {"model": {"module.sam.<name>": ...}, "optimizer": ..., "epoch": 3}
  sam_parity.py slice OUT_DIR CT_NIFTI LABEL_NIFTI [--label 5]
      OUT_DIR/input.sfta: "image" (1, 3, 1024, 1024) float32: the axial slice with the most
      voxels of LABEL, CT-windowed to [-160, 240] HU (MedSAM's level 40, width 400), min-max
      to [0, 1], three channels, longest side resized to 1024 (bilinear, half-pixel centres)
      and zero-padded bottom/right (LiteMedSAM); "mask" (1, 1, 1024, 1024) the label's mask
      transformed the same way (nearest); "box" (1, 4) x0, y0, x1, y1 of the resized mask.
  sam_parity.py infer OUT_DIR
      OUT_DIR/reference_infer.sfta: MedSAM's inference (medsam_inference in MedSAM_Inference.py):
      "embedding" = image_encoder(image), prompt_encoder(boxes=box), mask_decoder(...,
      multimask_output=False) -> "low_res_masks" (1, 1, 256, 256), "iou_predictions" (1, 1),
      "masks" = bilinear upsampling of the low-res logits to 1024 (align_corners False).
  sam_parity.py step OUT_DIR
      OUT_DIR/reference_step.sfta: one fine-tuning step as MedSAM's train_one_gpu.py: the
      prompt encoder frozen, loss = monai DiceLoss(sigmoid=True, squared_pred=True,
      reduction="mean") + BCEWithLogitsLoss(reduction="mean") on the upsampled 1024 x 1024
      logits against "mask"; "loss" and "grad/<name>" of a few parameters. The four global-
      attention blocks are checkpointed (recomputed in backward) to bound memory; the
      gradients are the same.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from convert_sam_weights import write_archive  # noqa: E402

GRAD_NAMES = [
    "image_encoder.patch_embed.proj.weight",
    "image_encoder.blocks.2.attn.rel_pos_h",
    "image_encoder.neck.0.weight",
    "mask_decoder.transformer.layers.0.self_attn.q_proj.weight",
    "mask_decoder.output_hypernetworks_mlps.0.layers.2.weight",
    "mask_decoder.output_upscaling.0.weight",
]


def build_sam(weights=None):
    from segment_anything import sam_model_registry

    sam = sam_model_registry["vit_b"]()
    if weights is not None:
        sam.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    return sam.eval()


def cmd_weights(args):
    torch.manual_seed(args.seed)
    sam = build_sam()
    g = torch.Generator().manual_seed(args.seed + 1)
    with torch.no_grad():
        for name, p in sam.named_parameters():
            constant = p.numel() > 1 and bool((p == p.flatten()[0]).all())
            if constant:
                p.add_(0.02 * torch.randn(p.shape, generator=g))
    sd = {k: v.detach().clone() for k, v in sam.state_dict().items()}
    os.makedirs(args.out, exist_ok=True)
    torch.save(sd, os.path.join(args.out, "sam_vit_b.pth"))
    wrapped = {"module.sam." + k: v for k, v in sd.items()}
    torch.save({"model": wrapped, "optimizer": {"state": {}, "param_groups": []}, "epoch": 3},
               os.path.join(args.out, "medsam_style.pth"))
    print(f"wrote {len(sd)} tensors")


def bilinear(img, out_h, out_w):
    """(H, W) -> (out_h, out_w), half-pixel centres, edge-clamped (numpy)."""
    h, w = img.shape

    def axis(n_in, n_out):
        src = (np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5
        src = np.clip(src, 0, None)
        i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
        i1 = np.minimum(i0 + 1, n_in - 1)
        return i0, i1, src - i0

    y0, y1, ty = axis(h, out_h)
    x0, x1, tx = axis(w, out_w)
    top = img[y0][:, x0] * (1 - tx) + img[y0][:, x1] * tx
    bot = img[y1][:, x0] * (1 - tx) + img[y1][:, x1] * tx
    return (top * (1 - ty)[:, None] + bot * ty[:, None]).astype(np.float32)


def cmd_slice(args):
    import nibabel as nib

    ct = np.asarray(nib.load(args.ct).dataobj).astype(np.float64)
    lab = np.asarray(nib.load(args.label).dataobj)
    z = int((lab == args.label_value).sum(axis=(0, 1)).argmax())
    img = np.clip(ct[:, :, z], -160.0, 240.0)
    img = (img - img.min()) / max(img.max() - img.min(), 1e-8)
    mask = (lab[:, :, z] == args.label_value).astype(np.float32)
    h, w = img.shape
    scale = 1024.0 / max(h, w)
    nh, nw = int(h * scale + 0.5), int(w * scale + 0.5)
    img_r = bilinear(img, nh, nw)
    iy = np.minimum((np.arange(nh) * (h / nh)).astype(np.int64), h - 1)
    ix = np.minimum((np.arange(nw) * (w / nw)).astype(np.int64), w - 1)
    mask_r = mask[iy][:, ix]
    image = np.zeros((1, 3, 1024, 1024), np.float32)
    image[0, :, :nh, :nw] = img_r[None]
    m = np.zeros((1, 1, 1024, 1024), np.float32)
    m[0, 0, :nh, :nw] = mask_r
    ys, xs = np.nonzero(m[0, 0])
    box = np.array([[xs.min(), ys.min(), xs.max(), ys.max()]], np.float32)
    write_archive(os.path.join(args.out, "input.sfta"),
                  {"image": torch.from_numpy(image), "mask": torch.from_numpy(m), "box": torch.from_numpy(box)})
    print(f"slice z={z} of {ct.shape}, resized {h}x{w} -> {nh}x{nw}, box {box[0].tolist()}")


def load_inputs(out):
    import json
    import struct

    path = os.path.join(out, "input.sfta")
    with open(path, "rb") as f:
        assert f.read(8) == b"SFTARCH1"
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n).decode("utf-8"))
        base = 16 + n
        tensors = {}
        for e in header["tensors"]:
            f.seek(base + e["offset"])
            arr = np.frombuffer(f.read(e["nbytes"]), dtype="<f4").reshape(e["shape"])
            tensors[e["name"]] = torch.from_numpy(arr.copy())
    return tensors


def medsam_forward(sam, image, box, checkpoint=False):
    import torch.nn.functional as F

    enc = sam.image_encoder
    if checkpoint:
        from torch.utils.checkpoint import checkpoint as ckpt

        x = enc.patch_embed(image)
        if enc.pos_embed is not None:
            x = x + enc.pos_embed
        for blk in enc.blocks:  # only the global-attention blocks hold large activations
            x = ckpt(blk, x, use_reentrant=False) if blk.window_size == 0 else blk(x)
        embedding = enc.neck(x.permute(0, 3, 1, 2))
    else:
        embedding = enc(image)
    sparse, dense = sam.prompt_encoder(points=None, boxes=box[:, None, :], masks=None)
    low_res, iou = sam.mask_decoder(image_embeddings=embedding, image_pe=sam.prompt_encoder.get_dense_pe(),
                                    sparse_prompt_embeddings=sparse, dense_prompt_embeddings=dense,
                                    multimask_output=False)
    masks = F.interpolate(low_res, size=(image.shape[2], image.shape[3]), mode="bilinear", align_corners=False)
    return embedding, low_res, iou, masks


def cmd_infer(args):
    torch.set_num_threads(args.threads)
    sam = build_sam(os.path.join(args.out, "sam_vit_b.pth"))
    inp = load_inputs(args.out)
    t0 = time.time()
    with torch.no_grad():
        embedding, low_res, iou, masks = medsam_forward(sam, inp["image"], inp["box"])
    write_archive(os.path.join(args.out, "reference_infer.sfta"),
                  {"embedding": embedding, "low_res_masks": low_res, "iou_predictions": iou, "masks": masks})
    print(f"segment_anything forward {time.time() - t0:.1f} s")


def cmd_step(args):
    from monai.losses import DiceLoss

    torch.set_num_threads(args.threads)
    sam = build_sam(os.path.join(args.out, "sam_vit_b.pth"))
    sam.train()
    for p in sam.prompt_encoder.parameters():
        p.requires_grad_(False)
    inp = load_inputs(args.out)
    t0 = time.time()
    _, _, _, masks = medsam_forward(sam, inp["image"], inp["box"], checkpoint=True)
    dice = DiceLoss(sigmoid=True, squared_pred=True, reduction="mean")
    bce = torch.nn.BCEWithLogitsLoss(reduction="mean")
    loss = dice(masks, inp["mask"]) + bce(masks, inp["mask"])
    loss.backward()
    params = dict(sam.named_parameters())
    out = {"loss": loss.detach().reshape(1)}
    for name in GRAD_NAMES:
        out["grad/" + name] = params[name].grad
    write_archive(os.path.join(args.out, "reference_step.sfta"), out)
    print(f"segment_anything step {time.time() - t0:.1f} s, loss {loss.item():.6f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("weights")
    w.add_argument("out")
    w.add_argument("--seed", type=int, default=0)
    s = sub.add_parser("slice")
    s.add_argument("out")
    s.add_argument("ct")
    s.add_argument("label")
    s.add_argument("--label-value", type=int, default=5)
    for name in ("infer", "step"):
        c = sub.add_parser(name)
        c.add_argument("out")
        c.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    {"weights": cmd_weights, "slice": cmd_slice, "infer": cmd_infer, "step": cmd_step}[args.cmd](args)


if __name__ == "__main__":
    main()
