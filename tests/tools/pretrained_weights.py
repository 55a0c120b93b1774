#!/usr/bin/env python3
"""Someone else's weights for tests/apps/test_pretrained.cpp, made by the reference packages
themselves (nothing downloaded):

    pretrained_weights.py monai OUT_DIR   # MONAI's UNet as the spleen recipe (configs/
                                          # spleen-ct-unet3d.yaml) builds it, 2 classes:
                                          # OUT_DIR/spleen_unet.pt (model.state_dict(), torch.save)
    pretrained_weights.py nnunet OUT_DIR  # dynamic_network_architectures' PlainConvUNet, 1 input
                                          # channel: OUT_DIR/plain_unet.pt (its state_dict) and
                                          # OUT_DIR/plain_unet_io.sfta ({"x", "y"}: eval-mode logits)

Exit code 3 when a package cannot be imported (scripts/setup.sh installs them).
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))

import torch  # noqa: E402


def monai(out):
    try:
        from monai.networks.nets import UNet
    except ImportError as e:
        print(f"monai not importable: {e}")
        return 3
    torch.manual_seed(0)
    net = UNet(spatial_dims=3, in_channels=1, out_channels=2, channels=(16, 32, 64, 128, 256),
               strides=(2, 2, 2, 2), num_res_units=2, norm="batch")
    with torch.no_grad():  # running statistics away from 0/1, as a trained network has them
        for name, b in net.named_buffers():
            if name.endswith("running_mean"):
                b.uniform_(-0.5, 0.5)
            elif name.endswith("running_var"):
                b.uniform_(0.5, 1.5)
    torch.save(net.state_dict(), os.path.join(out, "spleen_unet.pt"))
    print(f"monai UNet: {sum(1 for _ in net.state_dict())} tensors")
    return 0


def nnunet(out):
    try:
        from dynamic_network_architectures.architectures.unet import PlainConvUNet
    except ImportError as e:
        print(f"dynamic_network_architectures not importable: {e}")
        return 3
    from convert_sam_weights import write_archive

    torch.manual_seed(1)
    net = PlainConvUNet(input_channels=1, n_stages=3, features_per_stage=[4, 8, 16], conv_op=torch.nn.Conv3d,
                        kernel_sizes=[[3, 3, 3]] * 3, strides=[[1, 1, 1], [2, 2, 2], [2, 2, 2]],
                        n_conv_per_stage=2, num_classes=3, n_conv_per_stage_decoder=2, conv_bias=True,
                        norm_op=torch.nn.InstanceNorm3d, norm_op_kwargs={"eps": 1e-5, "affine": True},
                        nonlin=torch.nn.LeakyReLU, nonlin_kwargs={"inplace": True}, deep_supervision=False)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2 + (1.0 if ".norm." in name and name.endswith("weight") else 0.0))
    x = torch.randn(2, 1, 16, 16, 16, generator=gen)
    net.eval()
    with torch.no_grad():
        y = net(x)
    torch.save(net.state_dict(), os.path.join(out, "plain_unet.pt"))
    write_archive(os.path.join(out, "plain_unet_io.sfta"), {"x": x, "y": y})
    print(f"PlainConvUNet: {sum(1 for _ in net.state_dict())} tensors, logits {list(y.shape)}")
    return 0


if __name__ == "__main__":
    which, out = sys.argv[1], sys.argv[2]
    sys.exit({"monai": monai, "nnunet": nnunet}[which](out))
