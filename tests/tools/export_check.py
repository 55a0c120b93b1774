#!/usr/bin/env python3
"""Loads what `segflow export --to pytorch` wrote into the reference implementation and runs it.

    export_check.py STATE.pt SPEC.json IO.pt

STATE.pt is the exported state dict, SPEC.json its target and arguments, IO.pt a dict saved by
the C++ test (torch::pickle_save): for a UNet {"x": input, "y": segflow's eval-mode logits},
for SAM {"image": images, "embedding": segflow's image embedding, "box": (B, 4) boxes,
"low_res": segflow's low-resolution mask logits of image 0 with box 0}. Builds
monai.networks.nets.UNet, dynamic_network_architectures' PlainConvUNet or ResidualEncoderUNet, or
segment_anything's Sam from SPEC.json, loads STATE.pt with
strict=True, runs the same input and prints one JSON object: target, tensors, max_abs (of the
reference output) and max_abs_diff (reference vs segflow); for SAM also masks_max_abs and
masks_max_abs_diff. Exit 3 when the reference package
cannot be imported, 1 when the state dict does not load.
"""
import json
import os
import sys
from functools import partial

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def build_unet(spec):
    from monai.networks.nets import UNet

    a = dict(spec["args"])
    for k in ("act", "norm"):
        if isinstance(a[k], list):
            a[k] = (a[k][0], a[k][1])
    return UNet(**a)


def build_plain_unet(spec):
    from dynamic_network_architectures.architectures.unet import PlainConvUNet

    a = dict(spec["args"])
    for k in ("conv_op", "norm_op", "nonlin"):
        a[k] = getattr(torch.nn, a[k])
    return PlainConvUNet(**a)


def build_res_enc_unet(spec):
    from dynamic_network_architectures.architectures.unet import ResidualEncoderUNet

    a = dict(spec["args"])
    for k in ("conv_op", "norm_op", "nonlin"):
        a[k] = getattr(torch.nn, a[k])
    return ResidualEncoderUNet(**a)


def build_sam(spec):
    sys.path.insert(0, os.path.join(HERE, "..", "models", "reference"))
    from make_reference import stub_torchvision

    stub_torchvision()
    from segment_anything.modeling import ImageEncoderViT, MaskDecoder, PromptEncoder, Sam, TwoWayTransformer

    e = dict(spec["image_encoder"])
    eps = e.pop("layer_norm_eps")
    e["global_attn_indexes"] = tuple(e["global_attn_indexes"])
    enc = ImageEncoderViT(norm_layer=partial(torch.nn.LayerNorm, eps=eps), **e)
    p = spec["prompt_encoder"]
    pe = PromptEncoder(embed_dim=p["embed_dim"], image_embedding_size=tuple(p["image_embedding_size"]),
                       input_image_size=tuple(p["input_image_size"]), mask_in_chans=p["mask_in_chans"])
    d = dict(spec["mask_decoder"])
    d.pop("iou_head")
    dec = MaskDecoder(transformer_dim=d["transformer_dim"],
                      transformer=TwoWayTransformer(depth=d["transformer_depth"], embedding_dim=d["transformer_dim"],
                                                    mlp_dim=d["transformer_mlp_dim"],
                                                    num_heads=d["transformer_num_heads"],
                                                    attention_downsample_rate=d["attention_downsample_rate"]),
                      num_multimask_outputs=d["num_multimask_outputs"], iou_head_depth=d["iou_head_depth"],
                      iou_head_hidden_dim=d["iou_head_hidden_dim"])
    return Sam(image_encoder=enc, prompt_encoder=pe, mask_decoder=dec)


def main(argv):
    state_path, spec_path, io_path = argv[1:4]
    with open(spec_path) as f:
        spec = json.load(f)
    try:
        target = spec["target"]
        model = (build_plain_unet(spec) if target.endswith("PlainConvUNet")
                 else build_res_enc_unet(spec) if target.endswith("ResidualEncoderUNet")
                 else build_unet(spec) if target.endswith("UNet") else build_sam(spec))
    except ImportError as e:
        print(json.dumps({"error": f"reference package not importable: {e}"}))
        return 3
    state = torch.load(state_path, map_location="cpu", weights_only=True)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        print(json.dumps({"error": str(e).replace("\n", " ")}))
        return 1
    io = torch.load(io_path, map_location="cpu", weights_only=True)
    model.eval()
    with torch.no_grad():
        if spec["target"].endswith("UNet"):
            ref, ours = model(io["x"]), io["y"]
            if isinstance(ref, (list, tuple)):  # deep supervision: full resolution first
                ref = ref[0]
        else:
            ref, ours = model.image_encoder(io["image"]), io["embedding"]
    out = {"target": spec["target"], "tensors": len(state), "shape": list(ref.shape),
           "max_abs": ref.abs().max().item(), "max_abs_diff": (ref - ours).abs().max().item()}
    if "box" in io:  # SAM's masks for one image and its box, through the prompt encoder and decoder
        with torch.no_grad():
            emb = model.image_encoder(io["image"][:1])
            sparse, dense = model.prompt_encoder(points=None, boxes=io["box"][:1, None, :], masks=None)
            low, _ = model.mask_decoder(image_embeddings=emb, image_pe=model.prompt_encoder.get_dense_pe(),
                                        sparse_prompt_embeddings=sparse, dense_prompt_embeddings=dense,
                                        multimask_output=False)
        out["masks_max_abs"] = low.abs().max().item()
        out["masks_max_abs_diff"] = (low - io["low_res"]).abs().max().item()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
