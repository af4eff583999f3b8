#!/usr/bin/env python3
# bench/bn_recalibrate.py -- does a saved model's test accuracy depend on the BatchNorm running
# statistics its training gathered? (issue 30: ResNet-18 trained with bf16 activations tests lower
# than the fp32 run at the same training loss.)
#
# Each dptrain --save (the d2l models, PyTorch's state_dict names) is loaded into
# bench/torch_ref.py's model and evaluated in fp32 on the Fashion-MNIST test set as saved; then its
# running statistics are recomputed in fp32 from the first --batches training batches, as
# torch.optim.swa_utils.update_bn does (a plain average over the batches, train-mode forward, no
# gradients), and it is evaluated again. If a model's accuracy moves to the other's, the gap was
# in the statistics; if it stays, it is in the weights.
#
# Usage: bench/.venv-torch/bin/python3 bench/bn_recalibrate.py [--batches 40] [--batch 256]
#            [--data DIR] MODEL.safetensors [MODEL.safetensors ...]
import argparse
import contextlib
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_ref  # noqa: E402
from grad_error import read_safetensors  # noqa: E402


def recalibrate(model, x, batches, batch):
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None  # a cumulative average over the batches seen
    model.train()
    with torch.no_grad():
        for i in range(batches):
            model(x[i * batch:(i + 1) * batch])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("models", nargs="+")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--batch", type=int, default=256)
    a = p.parse_args()
    train_x, _, test_x, test_y = torch_ref.load_fashion_mnist(a.data)
    print("| model | test acc as saved | test loss | after recomputing BN statistics | test loss |")
    print("|---|---|---|---|---|")
    for path in a.models:
        meta, state = read_safetensors(path)
        model = torch_ref.build_model(meta.get("model", "resnet18"))
        model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
        before = torch_ref.evaluate(model, test_x, test_y, contextlib.nullcontext)
        recalibrate(model, train_x, a.batches, a.batch)
        after = torch_ref.evaluate(model, test_x, test_y, contextlib.nullcontext)
        print(f"| {os.path.basename(path)} | {before[0]:.4f} | {before[1]:.4f} | {after[0]:.4f} | {after[1]:.4f} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
