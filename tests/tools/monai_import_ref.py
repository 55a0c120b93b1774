#!/usr/bin/env python3
"""MONAI UNet weights for tests/apps/test_import_monai.cpp, built and run by MONAI itself
(nothing downloaded):

    monai_import_ref.py OUT_DIR
    monai_import_ref.py nnunet-trainer FOLD_DIR

The first writes
    OUT_DIR/bundle/configs/inference.json  a minimal bundle as MONAI's spleen_ct_segmentation
                                           has it: network_def (spatial_dims 3, channels
                                           (16, 32, 64, 128, 256), strides (2, 2, 2, 2),
                                           num_res_units 2, norm batch), its preprocessing
                                           (LoadImaged .. ScaleIntensityRanged) and inferer
    OUT_DIR/bundle/models/model.pt         that UNet's state_dict (torch.save), seed 0
    OUT_DIR/bundle_io.sfta                 {"x", "y"}: a (1, 1, 48, 32, 64) volume in MONAI's
                                           (C, x, y, z) order and the UNet's eval-mode logits
    OUT_DIR/small.pt                       a bare state dict: in 1, out 3, channels (4, 8, 16),
                                           strides ((2, 2, 1), 2), kernel_size (3, 3, 1),
                                           num_res_units 1, MONAI's default norm (instance, not
                                           affine) and act (PReLU); seed 1
    OUT_DIR/small_io.sfta                  {"x", "y"} for it, x (1, 1, 24, 20, 16)

The second rewrites FOLD_DIR/checkpoint_final.pth (a results folder segflow exported) in the
format nnU-Net's own trainer saves: nnunetv2's nnUNetTrainer is built from the folder's
plans.json and dataset.json (no data needed), its network takes the checkpoint's weights, and
nnUNetTrainer.save_checkpoint writes the file (state_dict as an OrderedDict, optimizer state,
logging with numpy floats, init_args with a torch.device).

The running statistics of batch norms are set away from 0 / 1 (as a trained network has
them) so that eval mode is tested. Exit code 3 when MONAI cannot be imported.
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))

import torch  # noqa: E402

SPLEEN_NET = {"_target_": "UNet", "spatial_dims": 3, "in_channels": 1, "out_channels": 2,
              "channels": [16, 32, 64, 128, 256], "strides": [2, 2, 2, 2], "num_res_units": 2, "norm": "batch"}

SPLEEN_PRE = [
    {"_target_": "LoadImaged", "keys": "image"},
    {"_target_": "EnsureChannelFirstd", "keys": "image"},
    {"_target_": "Orientationd", "keys": "image", "axcodes": "RAS"},
    {"_target_": "Spacingd", "keys": "image", "pixdim": [1.5, 1.5, 2.0], "mode": "bilinear"},
    {"_target_": "ScaleIntensityRanged", "keys": "image", "a_min": -57, "a_max": 164, "b_min": 0, "b_max": 1,
     "clip": True},
    {"_target_": "EnsureTyped", "keys": "image"},
]


def trained_like(net, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, b in net.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(torch.rand(b.shape, generator=gen) - 0.5)
            elif name.endswith("running_var"):
                b.copy_(torch.rand(b.shape, generator=gen) + 0.5)


def logits(net, shape, seed):
    from convert_sam_weights import write_archive  # noqa: F401 (checked importable here)

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen)
    net.eval()
    with torch.no_grad():
        y = net(x)
    return {"x": x, "y": y}


def main(out):
    try:
        from monai.networks.nets import UNet
    except ImportError as e:
        print(f"monai not importable: {e}")
        return 3
    from convert_sam_weights import write_archive

    torch.manual_seed(0)
    args = {k: v for k, v in SPLEEN_NET.items() if not k.startswith("_")}
    net = UNet(**args)
    trained_like(net, 10)
    os.makedirs(os.path.join(out, "bundle", "configs"), exist_ok=True)
    os.makedirs(os.path.join(out, "bundle", "models"), exist_ok=True)
    torch.save(net.state_dict(), os.path.join(out, "bundle", "models", "model.pt"))
    config = {"image_key": "image", "network_def": SPLEEN_NET,
              "network": "$@network_def.to(@device)",
              "preprocessing": {"_target_": "Compose", "transforms": SPLEEN_PRE},
              "inferer": {"_target_": "SlidingWindowInferer", "roi_size": [96, 96, 96], "sw_batch_size": 4,
                          "overlap": 0.5}}
    with open(os.path.join(out, "bundle", "configs", "inference.json"), "w") as f:
        json.dump(config, f, indent=2)
    write_archive(os.path.join(out, "bundle_io.sfta"), logits(net, (1, 1, 48, 32, 64), 11))

    torch.manual_seed(1)
    small = UNet(spatial_dims=3, in_channels=1, out_channels=3, channels=(4, 8, 16), strides=((2, 2, 1), 2),
                 kernel_size=(3, 3, 1), num_res_units=1)
    gen = torch.Generator().manual_seed(12)
    with torch.no_grad():  # PReLU slopes and biases away from their initial values
        for name, p in small.named_parameters():
            if p.dim() <= 1:
                p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    torch.save(small.state_dict(), os.path.join(out, "small.pt"))
    write_archive(os.path.join(out, "small_io.sfta"), logits(small, (1, 1, 24, 20, 16), 13))
    print(f"bundle UNet: {len(net.state_dict())} tensors; small UNet: {len(small.state_dict())} tensors")
    return 0


def nnunet_trainer(fold_dir):
    import tempfile

    with tempfile.TemporaryDirectory(prefix="nnunet_env_") as env:
        for var in ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_results"):
            os.environ[var] = os.path.join(env, var)  # nnunetv2 reads them on import
        return nnunet_trainer_in_env(fold_dir)


def nnunet_trainer_in_env(fold_dir):
    try:
        from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer
    except ImportError as e:
        print(f"nnunetv2 not importable: {e}")
        return 3
    results = os.path.dirname(os.path.abspath(fold_dir))
    with open(os.path.join(results, "plans.json")) as f:
        plans = json.load(f)
    with open(os.path.join(results, "dataset.json")) as f:
        dataset = json.load(f)
    path = os.path.join(fold_dir, "checkpoint_final.pth")
    old = torch.load(path, weights_only=True)
    plans["continue_training"] = False  # nnunetv2 2.8's trainer pops it
    trainer = nnUNetTrainer(plans, old["init_args"]["configuration"], int(old["init_args"]["fold"]), dataset,
                            torch.device("cpu"))
    # initialize() looks for the preprocessed data's file type only: one placeholder file.
    os.makedirs(trainer.preprocessed_dataset_folder, exist_ok=True)
    open(os.path.join(trainer.preprocessed_dataset_folder, "placeholder.npz"), "w").close()
    trainer.initialize()
    trainer.network.load_state_dict(old["network_weights"])
    trainer.logger.log("mean_fg_dice", 0.5, 0)  # numpy floats in the log, as after an epoch
    trainer.logger.log("ema_fg_dice", 0.5, 0)
    trainer.save_checkpoint(path)
    ck = torch.load(path, weights_only=False)
    print(json.dumps({"keys": sorted(ck.keys()), "weights_type": type(ck["network_weights"]).__name__,
                      "tensors": len(ck["network_weights"])}))
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "nnunet-trainer":
        sys.exit(nnunet_trainer(sys.argv[2]))
    sys.exit(main(sys.argv[1]))
