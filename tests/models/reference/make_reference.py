#!/usr/bin/env python3
"""Reference outputs of segment_anything's SAM, MONAI's UNet and nnU-Net's PlainConvUNet for
segflow's C++ models.

    make_reference.py sam  OUT_DIR              # needs segment_anything (torchvision is stubbed if absent)
    make_reference.py sam_prompts OUT_DIR       # the same SAM with point, box and mask prompts
    make_reference.py unet OUT_DIR              # needs monai
    make_reference.py unet_aniso OUT_DIR        # MONAI's UNet with per-axis strides and kernels
    make_reference.py plain_unet_aniso OUT_DIR  # needs dynamic_network_architectures (nnU-Net's)

Per-axis sizes go to the reference classes in their array order (z, y, x); segflow's configs
write them (x, y, z), so test_reference.cpp spells the same topology reversed.

Each writes OUT_DIR/<model>_weights.sfta (the reference model's random weights under
segflow's names) and OUT_DIR/<model>_io.sfta (inputs and reference outputs), both segflow
tensor archives written by scripts/convert_sam_weights.py. Exit code 3 when the reference
package cannot be imported (the C++ test then skips with a message).
The configurations here must match tests/models/test_reference.cpp.
"""

import os
import re
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "scripts"))

import torch  # noqa: E402
from convert_sam_weights import write_archive  # noqa: E402


def randomize(module, gen):
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2 + (1.0 if name.endswith("norm.weight") else 0.0))


def stub_torchvision():
    # segment_anything imports torchvision only for its predictor utilities.
    try:
        import torchvision  # noqa: F401
        return
    except ImportError:
        pass
    tv = types.ModuleType("torchvision")
    tr = types.ModuleType("torchvision.transforms")
    fn = types.ModuleType("torchvision.transforms.functional")
    ops = types.ModuleType("torchvision.ops")
    boxes = types.ModuleType("torchvision.ops.boxes")
    fn.resize = fn.to_pil_image = boxes.batched_nms = boxes.box_area = lambda *a, **k: None
    sys.modules.update({"torchvision": tv, "torchvision.transforms": tr, "torchvision.transforms.functional": fn,
                        "torchvision.ops": ops, "torchvision.ops.boxes": boxes})


def tiny_sam():
    """segment_anything's parts at test size with seeded random weights (and the generator,
    to go on drawing from it); None when segment_anything is not importable."""
    stub_torchvision()
    try:
        from segment_anything.modeling import ImageEncoderViT, MaskDecoder, PromptEncoder, TwoWayTransformer
    except ImportError as e:
        print(f"segment_anything not importable: {e}")
        return None
    from functools import partial

    torch.manual_seed(0)
    enc = ImageEncoderViT(img_size=64, patch_size=8, in_chans=3, embed_dim=64, depth=2, num_heads=2, mlp_ratio=4.0,
                          out_chans=64, qkv_bias=True, norm_layer=partial(torch.nn.LayerNorm, eps=1e-6),
                          use_rel_pos=True, window_size=3, global_attn_indexes=(1,))
    pe = PromptEncoder(embed_dim=64, image_embedding_size=(8, 8), input_image_size=(64, 64), mask_in_chans=16)
    dec = MaskDecoder(num_multimask_outputs=3,
                      transformer=TwoWayTransformer(depth=2, embedding_dim=64, mlp_dim=128, num_heads=2),
                      transformer_dim=64, iou_head_depth=3, iou_head_hidden_dim=64)
    model = torch.nn.ModuleDict({"image_encoder": enc, "prompt_encoder": pe, "mask_decoder": dec})
    gen = torch.Generator().manual_seed(1)
    randomize(model, gen)
    model.eval()
    return enc, pe, dec, model, gen


def sam(out):
    built = tiny_sam()
    if built is None:
        return 3
    enc, pe, dec, model, gen = built
    import torch.nn.functional as F

    image = torch.randn(2, 3, 64, 64, generator=gen)
    box = torch.tensor([[5.0, 7.0, 40.0, 50.0], [20.0, 3.0, 60.0, 33.0]])
    with torch.no_grad():
        emb = enc(image)
        sparse, dense = pe(points=None, boxes=box[:, None, :], masks=None)
        # MedSAM's pairing: image i with box i (segment_anything repeats the image per box).
        tokens = torch.cat([dec.iou_token.weight, dec.mask_tokens.weight], 0).unsqueeze(0).expand(2, -1, -1)
        tokens = torch.cat([tokens, sparse], 1)
        src = emb + dense
        pos = torch.repeat_interleave(pe.get_dense_pe(), 2, dim=0)
        hs, src = dec.transformer(src, pos, tokens)
        b, c, h, w = emb.shape
        up = dec.output_upscaling(src.transpose(1, 2).view(b, c, h, w))
        hyper = torch.stack([dec.output_hypernetworks_mlps[i](hs[:, 1 + i, :]) for i in range(4)], 1)
        bb, cc, hh, ww = up.shape
        masks = (hyper @ up.view(bb, cc, hh * ww)).view(bb, -1, hh, ww)
        iou = dec.iou_prediction_head(hs[:, 0, :])
        low = masks[:, 0:1]
        full = F.interpolate(low, size=(64, 64), mode="bilinear", align_corners=False)
    write_archive(os.path.join(out, "sam_weights.sfta"), dict(model.state_dict()))
    write_archive(os.path.join(out, "sam_io.sfta"), {"image": image, "box": box, "embedding": emb, "low_res": low,
                                                     "masks": full, "iou": iou[:, 0:1]})
    return 0


def sam_prompts(out):
    """Point, box and mask prompts through segment_anything's own PromptEncoder.forward and
    MaskDecoder.forward (single and multimask) for one image, on the weights sam() uses."""
    built = tiny_sam()
    if built is None:
        return 3
    enc, pe, dec, model, _ = built
    write_archive(os.path.join(out, "sam_weights.sfta"), dict(model.state_dict()))
    gen = torch.Generator().manual_seed(2)
    image = torch.randn(1, 3, 64, 64, generator=gen)
    points = torch.tensor([[[20.0, 30.0], [45.0, 12.0], [33.0, 50.0]]])
    labels = torch.tensor([[1.0, 0.0, 1.0]])
    box = torch.tensor([[8.0, 10.0, 50.0, 55.0]])
    mask = torch.randn(1, 1, 32, 32, generator=gen) * 3
    cases = {
        "points": dict(points=(points, labels), boxes=None, masks=None, multi=True),
        "points_box": dict(points=(points[:, :2], labels[:, :2]), boxes=box, masks=None, multi=False),
        "box_mask": dict(points=None, boxes=box, masks=mask, multi=False),
        "points_mask": dict(points=(points[:, :1], labels[:, :1]), boxes=None, masks=mask, multi=True),
    }
    result = {"image": image, "points": points, "labels": labels, "box": box, "mask": mask}
    with torch.no_grad():
        emb = enc(image)
        for name, c in cases.items():
            sparse, dense = pe(points=c["points"], boxes=c["boxes"], masks=c["masks"])
            low, iou = dec(image_embeddings=emb, image_pe=pe.get_dense_pe(), sparse_prompt_embeddings=sparse,
                           dense_prompt_embeddings=dense, multimask_output=c["multi"])
            result.update({f"{name}/sparse": sparse, f"{name}/dense": dense, f"{name}/low_res": low,
                           f"{name}/iou": iou})
    write_archive(os.path.join(out, "sam_prompts.sfta"), result)
    return 0


def monai_to_segflow(name, n_levels):
    """MONAI UNet parameter name -> segflow UNet name (num_res_units > 0)."""
    rest = name[len("model."):]
    level = 0
    while rest.startswith("1.submodule."):
        rest = rest[len("1.submodule."):]
        level += 1
        if level == n_levels:  # the bottom ResidualUnit inside the deepest skip connection
            return "bottom." + unit_names(rest)
    head, rest = rest.split(".", 1)
    if head == "0":
        return f"down.{level}." + unit_names(rest)
    assert head == "2", name
    first, rest = rest.split(".", 1)
    if first == "0":  # the transposed Convolution
        return f"up.{level}.conv." + adn_names(rest)
    return f"up.{level}.ru." + unit_names(rest)


def adn_names(rest):
    return rest.replace("adn.N.", "norm.").replace("adn.A.", "act.")


def unit_names(rest):
    m = re.match(r"conv\.unit(\d+)\.(.*)", rest)
    if m:
        return f"conv.{m.group(1)}." + adn_names(m.group(2))
    return rest  # residual.weight / residual.bias


def unet(out):
    try:
        from monai.networks.layers import Norm
        from monai.networks.nets import UNet
    except ImportError as e:
        print(f"monai not importable: {e}")
        return 3
    torch.manual_seed(0)
    channels = (4, 8, 16)
    model = UNet(spatial_dims=3, in_channels=1, out_channels=2, channels=channels, strides=(2, 2),
                 num_res_units=2, norm=Norm.BATCH)
    gen = torch.Generator().manual_seed(1)
    randomize(model, gen)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(torch.randn(b.shape, generator=gen) * 0.1)
            elif name.endswith("running_var"):
                b.copy_(torch.rand(b.shape, generator=gen) + 0.5)
    x = torch.randn(2, 1, 8, 12, 16, generator=gen)
    model.eval()
    with torch.no_grad():
        y_eval = model(x)
    sd = {monai_to_segflow(k, len(channels) - 1): v.clone() for k, v in model.state_dict().items()}
    model.train()
    with torch.no_grad():
        y_train = model(x)
    write_archive(os.path.join(out, "unet_weights.sfta"), sd)
    write_archive(os.path.join(out, "unet_io.sfta"), {"x": x, "y_eval": y_eval, "y_train": y_train})
    return 0


def unet_aniso(out):
    """MONAI's UNet with anisotropic strides and kernels (thick slices: z pooled once, 1-voxel
    kernels along z), residual units, affine instance norm (segflow's instance norm)."""
    try:
        from monai.networks.nets import UNet
    except ImportError as e:
        print(f"monai not importable: {e}")
        return 3
    torch.manual_seed(0)
    channels = (4, 8, 16)
    # (z, y, x): level 0 pools y and x only; test_reference.cpp writes [[2, 2, 1], [2, 2, 2]].
    model = UNet(spatial_dims=3, in_channels=1, out_channels=3, channels=channels, strides=((1, 2, 2), (2, 2, 2)),
                 kernel_size=(1, 3, 3), up_kernel_size=(1, 3, 3), num_res_units=2,
                 norm=("instance", {"affine": True}))
    gen = torch.Generator().manual_seed(2)
    randomize(model, gen)
    x = torch.randn(2, 1, 6, 12, 16, generator=gen)
    model.eval()
    with torch.no_grad():
        y = model(x)
    sd = {monai_to_segflow(k, len(channels) - 1): v.clone() for k, v in model.state_dict().items()}
    write_archive(os.path.join(out, "unet_aniso_weights.sfta"), sd)
    write_archive(os.path.join(out, "unet_aniso_io.sfta"), {"x": x, "y": y})
    return 0


def nnunet_to_segflow(name):
    """nnU-Net PlainConvUNet state_dict name -> segflow PlainConvUNet name; None for the
    duplicates (all_modules.* repeats conv/norm; decoder.encoder.* repeats the encoder)."""
    if ".all_modules." in name or name.startswith("decoder.encoder."):
        return None
    m = re.match(r"encoder\.stages\.(\d+)\.0\.convs\.(\d+)\.(conv|norm)\.(\w+)$", name)
    if m:
        return f"encoder_stages.{m.group(1)}.{m.group(2)}.{m.group(3)}.{m.group(4)}"
    m = re.match(r"decoder\.stages\.(\d+)\.convs\.(\d+)\.(conv|norm)\.(\w+)$", name)
    if m:
        return f"decoder_stages.{m.group(1)}.{m.group(2)}.{m.group(3)}.{m.group(4)}"
    m = re.match(r"decoder\.(transpconvs|seg_layers)\.(\d+)\.(\w+)$", name)
    assert m, name
    return f"{m.group(1)}.{m.group(2)}.{m.group(3)}"


def plain_unet_aniso(out):
    """nnU-Net's PlainConvUNet (dynamic_network_architectures, as nnU-Net v2 builds it from a
    plan) with anisotropic pooling and kernels, deep supervision on."""
    try:
        from dynamic_network_architectures.architectures.unet import PlainConvUNet
    except ImportError as e:
        print(f"dynamic_network_architectures not importable: {e}")
        return 3
    torch.manual_seed(0)
    # (z, y, x), as nnU-Net's plans.json lists them; test_reference.cpp writes the reverse.
    strides = [[1, 1, 1], [1, 2, 2], [2, 2, 2], [2, 2, 2]]
    kernels = [[1, 3, 3], [3, 3, 3], [3, 3, 3], [3, 3, 3]]
    model = PlainConvUNet(input_channels=1, n_stages=4, features_per_stage=[4, 8, 16, 16],
                          conv_op=torch.nn.Conv3d, kernel_sizes=kernels, strides=strides, n_conv_per_stage=2,
                          num_classes=3, n_conv_per_stage_decoder=2, conv_bias=True,
                          norm_op=torch.nn.InstanceNorm3d, norm_op_kwargs={"eps": 1e-5, "affine": True},
                          nonlin=torch.nn.LeakyReLU, nonlin_kwargs={"inplace": True}, deep_supervision=True)
    gen = torch.Generator().manual_seed(3)
    randomize(model, gen)
    x = torch.randn(2, 1, 8, 16, 24, generator=gen)
    model.eval()
    with torch.no_grad():
        ys = model(x)
    sd = {}
    for k, v in model.state_dict().items():
        n = nnunet_to_segflow(k)
        if n is not None:
            sd[n] = v.clone()
    write_archive(os.path.join(out, "plain_unet_aniso_weights.sfta"), sd)
    write_archive(os.path.join(out, "plain_unet_aniso_io.sfta"), {"x": x, **{f"y{i}": y for i, y in enumerate(ys)}})
    return 0


if __name__ == "__main__":
    which, out = sys.argv[1], sys.argv[2]
    sys.exit({"sam": sam, "sam_prompts": sam_prompts, "unet": unet, "unet_aniso": unet_aniso, "plain_unet_aniso": plain_unet_aniso}[which](out))
