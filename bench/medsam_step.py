#!/usr/bin/env python3
"""MedSAM's own training loop, as the baseline of bench/medsam-bench.sh (issue 32 item 4).

usage: medsam_step.py slices DATASET OUT_DIR --img S [--a-min -200 --a-max 300]
           MedSAM's npy format from a segflow dataset (imagesTr/*_0000.nii.gz, labelsTr/*.nii.gz):
           every axial slice with foreground, the CT window to [0, 1], resized to S x S
           (bilinear; labels nearest), three channels: OUT_DIR/imgs/<case>-<z>.npy (S, S, 3)
           float32 and OUT_DIR/gts/<case>-<z>.npy (S, S) uint8, as MedSAM's pre_CT_MR.py writes.
       medsam_step.py train NPY_DIR --preset tiny|small|vit_b --batch B --steps N [--warmup W]
           [--threads T] [--device cpu|cuda]
           MedSAM's train_one_gpu.py step on those files: segment_anything's Sam (vit_b from its
           registry; tiny and small with segflow's preset sizes, models/nets/sam.cpp), a random label's
           box with MedSAM's jitter (bbox_shift 20 at 1024, scaled), the image encoder and mask
           decoder trained, the prompt encoder frozen, masks upsampled to S, DiceLoss(sigmoid,
           squared_pred) + BCEWithLogits, AdamW(lr 1e-4, weight_decay 0.01), fp32. Prints one
           JSON line: samples_per_s, step_ms (median of the timed steps), data_wait_ms,
           pipeline_efficiency (compute / wall), peak_host_mb (ru_maxrss).
"""
import argparse
import glob
import json
import os
import resource
import statistics
import sys
import time

import numpy as np

# segflow's presets (models/nets/sam.cpp SamOptions::preset): encoder and decoder sizes.
PRESETS = {
    "tiny": dict(img=64, patch=8, embed=64, depth=2, heads=2, out=64, rel_pos=False, window=0, glob=(),
                 dec_heads=2, dec_mlp=128, iou_hidden=64),
    "small": dict(img=256, patch=16, embed=256, depth=4, heads=4, out=128, rel_pos=False, window=0, glob=(),
                  dec_heads=4, dec_mlp=512, iou_hidden=128),
}


class _OneBoxPerImage:
    """MedSAM's change to segment_anything's mask decoder (its repository's copy): a batch of
    images with one box each is decoded image by image, where the PyPI decoder repeats every
    image embedding for every prompt of the batch. Stands in for `torch` inside
    segment_anything.modeling.mask_decoder; repeat_interleave of a tensor that already has
    one row per prompt returns it unchanged, as MedSAM's code does."""

    def __init__(self, torch_module):
        self._torch = torch_module

    def __getattr__(self, name):
        return getattr(self._torch, name)

    def repeat_interleave(self, x, repeats, dim=0):
        if dim == 0 and isinstance(repeats, int) and x.shape[0] == repeats:
            return x
        return self._torch.repeat_interleave(x, repeats, dim=dim)


def build_sam(preset):
    import torch
    from functools import partial
    import segment_anything.modeling.mask_decoder as md

    md.torch = _OneBoxPerImage(torch)

    if preset == "vit_b":
        from segment_anything import sam_model_registry

        return sam_model_registry["vit_b"]()
    from segment_anything.modeling import (ImageEncoderViT, MaskDecoder, PromptEncoder, Sam,
                                           TwoWayTransformer)

    p = PRESETS[preset]
    grid = p["img"] // p["patch"]
    return Sam(
        image_encoder=ImageEncoderViT(depth=p["depth"], embed_dim=p["embed"], img_size=p["img"], mlp_ratio=4,
                                      norm_layer=partial(torch.nn.LayerNorm, eps=1e-6), num_heads=p["heads"],
                                      patch_size=p["patch"], qkv_bias=True, use_rel_pos=p["rel_pos"],
                                      global_attn_indexes=p["glob"], window_size=p["window"],
                                      out_chans=p["out"]),
        prompt_encoder=PromptEncoder(embed_dim=p["out"], image_embedding_size=(grid, grid),
                                     input_image_size=(p["img"], p["img"]), mask_in_chans=16),
        mask_decoder=MaskDecoder(num_multimask_outputs=3,
                                 transformer=TwoWayTransformer(depth=2, embedding_dim=p["out"],
                                                               mlp_dim=p["dec_mlp"], num_heads=p["dec_heads"]),
                                 transformer_dim=p["out"], iou_head_depth=3, iou_head_hidden_dim=p["iou_hidden"]),
        pixel_mean=[0.0, 0.0, 0.0], pixel_std=[1.0, 1.0, 1.0])


def cmd_slices(args):
    import nibabel as nib
    import torch
    import torch.nn.functional as F

    os.makedirs(os.path.join(args.out, "imgs"), exist_ok=True)
    os.makedirs(os.path.join(args.out, "gts"), exist_ok=True)
    n = 0
    for img_file in sorted(glob.glob(os.path.join(args.dataset, "imagesTr", "*_0000.nii.gz"))):
        case = os.path.basename(img_file)[: -len("_0000.nii.gz")]
        img = np.asanyarray(nib.load(img_file).dataobj).astype(np.float32)
        lab = np.asanyarray(nib.load(os.path.join(args.dataset, "labelsTr", case + ".nii.gz")).dataobj)
        img = (np.clip(img, args.a_min, args.a_max) - args.a_min) / (args.a_max - args.a_min)
        for z in range(img.shape[2]):
            gt = lab[:, :, z]
            if not gt.any():
                continue
            t = torch.from_numpy(np.ascontiguousarray(img[:, :, z]))[None, None]
            im = F.interpolate(t, size=(args.img, args.img), mode="bilinear", align_corners=False)[0, 0]
            g = F.interpolate(torch.from_numpy(gt.astype(np.float32))[None, None], size=(args.img, args.img),
                              mode="nearest")[0, 0]
            np.save(os.path.join(args.out, "imgs", f"{case}-{z:03d}.npy"),
                    np.repeat(im.numpy()[:, :, None], 3, axis=2).astype(np.float32))
            np.save(os.path.join(args.out, "gts", f"{case}-{z:03d}.npy"), g.numpy().astype(np.uint8))
            n += 1
    print(json.dumps({"slices": n, "img": args.img, "out": args.out}))


class NpySlices:
    """MedSAM's NpyDataset: an image, one random label of its ground truth, the label's box
    with a random shift of up to bbox_shift pixels per side."""

    def __init__(self, root, bbox_shift, seed):
        self.imgs = sorted(glob.glob(os.path.join(root, "imgs", "*.npy")))
        self.root = root
        self.shift = bbox_shift
        self.rng = np.random.default_rng(seed)

    def __len__(self):
        return len(self.imgs)

    def __getitem__(self, i):
        import torch

        img = np.load(self.imgs[i])
        gt = np.load(os.path.join(self.root, "gts", os.path.basename(self.imgs[i])))
        labels = np.unique(gt)[1:]
        gt2d = (gt == self.rng.choice(labels)).astype(np.uint8)
        ys, xs = np.where(gt2d > 0)
        h, w = gt2d.shape
        s = self.shift
        box = [max(0, xs.min() - self.rng.integers(0, s + 1)), max(0, ys.min() - self.rng.integers(0, s + 1)),
               min(w, xs.max() + self.rng.integers(0, s + 1)), min(h, ys.max() + self.rng.integers(0, s + 1))]
        return (torch.from_numpy(img.transpose(2, 0, 1)).float(), torch.from_numpy(gt2d[None]).float(),
                torch.tensor(box, dtype=torch.float32))


def cmd_train(args):
    import torch
    import torch.nn.functional as F
    from monai.losses import DiceLoss

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    sam = build_sam(args.preset).to(device)
    sam.train()
    for p in sam.prompt_encoder.parameters():
        p.requires_grad_(False)
    params = list(sam.image_encoder.parameters()) + list(sam.mask_decoder.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)
    dice = DiceLoss(sigmoid=True, squared_pred=True, reduction="mean")
    bce = torch.nn.BCEWithLogitsLoss(reduction="mean")
    img_size = sam.image_encoder.img_size
    data = NpySlices(args.npy, max(1, round(20 * img_size / 1024)), 0)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=True, num_workers=0,
                                         drop_last=True, generator=torch.Generator().manual_seed(0))
    steps, waits, computes = [], [], []
    it = iter(loader)
    wall0 = None
    for k in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        try:
            image, gt, box = next(it)
        except StopIteration:
            it = iter(loader)
            image, gt, box = next(it)
        image, gt, box = image.to(device), gt.to(device), box.to(device)
        t1 = time.perf_counter()
        emb = sam.image_encoder(image)
        with torch.no_grad():
            sparse, dense = sam.prompt_encoder(points=None, boxes=box[:, None, :], masks=None)
        low, _ = sam.mask_decoder(image_embeddings=emb, image_pe=sam.prompt_encoder.get_dense_pe(),
                                  sparse_prompt_embeddings=sparse, dense_prompt_embeddings=dense,
                                  multimask_output=False)
        masks = F.interpolate(low, size=(img_size, img_size), mode="bilinear", align_corners=False)
        loss = dice(masks, gt) + bce(masks, gt)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        if k == args.warmup:
            wall0 = t0
        if k >= args.warmup:
            steps.append(t2 - t0)
            waits.append(t1 - t0)
            computes.append(t2 - t1)
    wall = time.perf_counter() - wall0
    print(json.dumps({
        "bench": "medsam_step", "side": "medsam", "preset": args.preset, "img_size": img_size,
        "batch_size": args.batch, "steps": args.steps, "device": args.device, "threads": args.threads,
        "samples_per_s": args.batch * args.steps / wall, "step_ms": 1000 * statistics.median(steps),
        "data_wait_ms": 1000 * statistics.mean(waits), "pipeline_efficiency": sum(computes) / wall,
        "peak_host_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "loss_last": float(loss.item())}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("slices")
    s.add_argument("dataset")
    s.add_argument("out")
    s.add_argument("--img", type=int, required=True)
    s.add_argument("--a-min", type=float, default=-200.0)
    s.add_argument("--a-max", type=float, default=300.0)
    t = sub.add_parser("train")
    t.add_argument("npy")
    t.add_argument("--preset", choices=["tiny", "small", "vit_b"], required=True)
    t.add_argument("--batch", type=int, default=2)
    t.add_argument("--steps", type=int, default=10)
    t.add_argument("--warmup", type=int, default=2)
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--device", default="cpu")
    args = ap.parse_args()
    {"slices": cmd_slices, "train": cmd_train}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
