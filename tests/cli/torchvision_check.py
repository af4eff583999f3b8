#!/usr/bin/env python3
"""torchvision_check.py SAVE DATA METRICS [SAVE DATA METRICS ...]: for each triple, loads a dptrain --save of resnet18-tv, resnet34 or
resnet50 into torchvision's own model (torchvision.models.resnet18/34/50(num_classes=K), the CIFAR
stem swapped in where the file records it) with load_state_dict(strict=True), evaluates it in eval
mode on DATA's test set (test_images.npy N x H x W x 3 uint8, test_labels.npy; inputs x / 255, as a
run without --normalize gives them) and compares the mean cross-entropy and the top-1 accuracy
with the last test_loss and test_acc of dptrain's --metrics file. Exit 0 when they agree (loss
within 1e-4 relative, accuracy exactly), 1 otherwise, 77 when torchvision is not importable."""
import json
import struct
import sys

try:
    import numpy as np
    import torch
    import torchvision
except ImportError as e:
    print(f"skip: {e}")
    sys.exit(77)

TORCHVISION = {"resnet18-tv": "resnet18", "resnet34": "resnet34", "resnet50": "resnet50"}
DTYPES = {"F32": torch.float32, "I64": torch.int64}


def read_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    state = {}
    for name, t in header.items():
        a, b = t["data_offsets"]
        data = bytearray(raw[8 + n + a:8 + n + b])
        state[name] = torch.frombuffer(data, dtype=DTYPES[t["dtype"]]).reshape(t["shape"]).clone()
    return meta, state


def check(save, data, metrics):
    meta, state = read_safetensors(save)
    name, stem, classes = meta["model"], meta["stem"], int(meta["num_classes"])
    model = getattr(torchvision.models, TORCHVISION[name])(num_classes=classes)
    if stem == "cifar":  # the CIFAR stem under torchvision's names: conv1 3x3 stride 1, no max-pool
        model.conv1 = torch.nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = torch.nn.Identity()
    else:
        assert stem == "imagenet", stem
    model.load_state_dict(state, strict=True)  # raises naming any missing, extra or misshapen tensor
    model.eval()
    images = np.load(f"{data}/test_images.npy")
    labels = torch.from_numpy(np.load(f"{data}/test_labels.npy").astype(np.int64))
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255.0
    with torch.no_grad():
        logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits.double(), labels).item()
    acc = (logits.argmax(1) == labels).double().mean().item()
    epoch = [r for r in map(json.loads, open(metrics)) if r.get("type") == "epoch"][-1]
    ours_loss, ours_acc = epoch["test_loss"], epoch["test_acc"]
    print(f"{name} ({stem} stem, {classes} classes, {len(labels)} images): torchvision loss {loss:.9g} "
          f"accuracy {acc:.6g}; dptrain loss {ours_loss:.9g} accuracy {ours_acc:.6g}")
    if abs(loss - ours_loss) > 1e-4 * max(abs(loss), 1.0) or abs(acc - ours_acc) > 1e-12:
        print(f"FAIL: {save}: torchvision's evaluation of the saved model differs from dptrain's")
        return False
    return True


if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or len(args) % 3:
        sys.exit(__doc__)
    results = [check(*args[i:i + 3]) for i in range(0, len(args), 3)]  # every file, then the verdict
    sys.exit(0 if all(results) else 1)
