"""Host memory of one training step of the spleen recipe's UNet in PyTorch (MONAI's UNet:
16-256 channels, 2 residual units, batch norm), float32 on the CPU: how much of segflow's
peak is the step itself. Prints one JSON line:
  {"bench": "unet_step_memory", "batch": B, "patch": P, "before_mb": ..., "peak_mb": ...,
   "step_mb": peak - before}
usage: .venv/bin/python bench/baselines/unet_step_memory.py [--batch 4] [--patch 96] [--threads 2]
"""
import argparse
import json
import resource

import torch
from monai.networks.nets import UNet


def max_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--patch", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    net = UNet(3, 1, 5, (16, 32, 64, 128, 256), (2, 2, 2, 2), num_res_units=2, norm="batch")
    opt = torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9)
    x = torch.rand(a.batch, 1, a.patch, a.patch, a.patch)
    y = torch.randint(0, 5, (a.batch, a.patch, a.patch, a.patch))
    before = max_rss_mb()
    for _ in range(2):
        loss = torch.nn.functional.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    peak = max_rss_mb()
    print(json.dumps({"bench": "unet_step_memory", "batch": a.batch, "patch": a.patch, "before_mb": round(before),
                      "peak_mb": round(peak), "step_mb": round(peak - before)}))


if __name__ == "__main__":
    main()
