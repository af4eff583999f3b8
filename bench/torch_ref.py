#!/usr/bin/env python3
# bench/torch_ref.py -- PyTorch reference for dptrain's workloads (LeNet and the
# d2l ResNet-18 on Fashion-MNIST, d2l "multi-GPU training" chapter recipes).
# Used by bench/*.sh to compare speed and accuracy against dptrain; on the CPU (Debian's
# interpreter, torch 1.13: /usr/bin/python3 bench/torch_ref.py) or, with --device cuda, on a GPU
# (the device machine's PyTorch): data on the GPU once, no host sync inside the epoch, optional
# bf16 autocast. --config picks how PyTorch is run: "eager" (the default: NCHW, cudnn.benchmark
# off -- the PyTorch a user writes first) or as a user tuning for speed would ("tuned":
# channels-last and cudnn.benchmark; "compile", "compile-nocg": the same under torch.compile in
# mode max-autotune, with and without CUDA graphs; "compile-cpu": channels-last under Inductor's
# default mode, the CPU's), so that dptrain is measured against the fastest PyTorch, not only the
# plainest (tests/gpu/device_check.sh, bench/gpu_table.py; bench/bench.py on the CPU, where
# --warmup-steps keeps compilation out of the timed epoch and --compile-timeout bounds it).
#
# Examples:
#   /usr/bin/python3 bench/torch_ref.py --model lenet --recipe d2l --epochs 1 --threads 1 --json
#   /usr/bin/python3 bench/torch_ref.py --model resnet18 --print-params
#   /usr/bin/python3 bench/torch_ref.py --model lenet --ddp --nproc 2 --max-steps 20
#   python3 bench/torch_ref.py --model resnet18 --device cuda --bf16 --epochs 10 --json
#   python3 bench/torch_ref.py --model resnet18 --device cuda --tf32 --config compile --epochs 3 --json
#   bench/.venv-torch/bin/python3 bench/torch_ref.py --model lenet --epochs 1 --json --config compile-cpu \
#       --warmup-steps 2 --compile-timeout 600
#   WORLD_SIZE=2 RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \
#       /usr/bin/python3 bench/torch_ref.py --ddp ...   (one such process per rank)
import argparse
import contextlib
import copy
import gzip
import json
import math
import os
import socket
import sys
import threading
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

DATA_DIR_DEFAULT = "/usr/share/datasets/fashion-mnist"
LENET_PARAMS = 129068


# ----------------------------------------------------------------------------- data
def read_idx_gz(path):
    """Reads an IDX file (gzip-compressed) into a numpy array of its declared shape."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    if raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{path}: size {data.size} does not match dims {dims}")
    return data.reshape(dims)


def load_fashion_mnist(data_dir):
    """Returns (train_x, train_y, test_x, test_y); x float32 in [0,1], [N,1,28,28]; y int64."""
    def images(name):
        a = read_idx_gz(os.path.join(data_dir, name))
        return torch.from_numpy(a.astype(np.float32) / 255.0).reshape(-1, 1, 28, 28)

    def labels(name):
        return torch.from_numpy(read_idx_gz(os.path.join(data_dir, name)).astype(np.int64))

    return (images("train-images-idx3-ubyte.gz"), labels("train-labels-idx1-ubyte.gz"),
            images("t10k-images-idx3-ubyte.gz"), labels("t10k-labels-idx1-ubyte.gz"))


# ----------------------------------------------------------------------------- models
class LeNet(nn.Module):
    """d2l 12.5 LeNet variant: conv(1,20,3) relu avgpool conv(20,50,5) relu avgpool
    flatten fc(800,128) relu fc(128,10)."""

    def __init__(self, num_classes=10, in_channels=1, rows=28, cols=28):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 20, kernel_size=3)
        self.conv2 = nn.Conv2d(20, 50, kernel_size=5)
        # As dptrain sizes fc1 from the images (its --save metadata's input_shape is "rows,cols,C").
        side = lambda n: ((n - 2) // 2 - 4) // 2
        self.fc1 = nn.Linear(50 * side(rows) * side(cols), 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x):
        x = F.avg_pool2d(F.relu(self.conv1(x)), kernel_size=2, stride=2)   # 20x13x13
        x = F.avg_pool2d(F.relu(self.conv2(x)), kernel_size=2, stride=2)   # 50x4x4
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        return self.fc2(x)


class Residual(nn.Module):
    """d2l Residual block: conv3x3(stride) BN ReLU conv3x3 BN, + (1x1 conv(stride) | identity), ReLU.
    All convs have bias=True as in d2l."""

    def __init__(self, in_ch, out_ch, use_1x1conv=False, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, kernel_size=3, padding=1, stride=stride)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, kernel_size=3, padding=1)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.downsample = (nn.Conv2d(in_ch, out_ch, kernel_size=1, stride=stride)
                           if use_1x1conv else None)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        if self.downsample is not None:
            x = self.downsample(x)
        return F.relu(y + x)


class ResNet18(nn.Module):
    """d2l 12.6 modified ResNet-18 for 1x28x28 input: conv3x3 s1 p1 (64) BN ReLU, no max-pool,
    4 stages x 2 Residual blocks (64, 128, 256, 512), global avg pool, fc 512->10."""

    def __init__(self, num_classes=10, in_channels=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1)
        self.bn1 = nn.BatchNorm2d(64)
        self.layer1 = self._stage(64, 64, first=True)
        self.layer2 = self._stage(64, 128)
        self.layer3 = self._stage(128, 256)
        self.layer4 = self._stage(256, 512)
        self.fc = nn.Linear(512, num_classes)

    @staticmethod
    def _stage(in_ch, out_ch, first=False):
        if first:
            blocks = [Residual(in_ch, out_ch), Residual(out_ch, out_ch)]
        else:
            blocks = [Residual(in_ch, out_ch, use_1x1conv=True, stride=2),
                      Residual(out_ch, out_ch)]
        return nn.Sequential(*blocks)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


class Bottleneck(nn.Module):
    """torchvision's ResNet-50 block (v1.5): 1x1, 3x3 (the stride), 1x1 (x4) convolutions without
    biases, each followed by BN; downsample = 1x1 conv (stride) + BN where the shape changes."""

    def __init__(self, in_ch, width, stride=1):
        super().__init__()
        out_ch = width * 4
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.downsample = (nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False),
                                         nn.BatchNorm2d(out_ch))
                           if stride != 1 or in_ch != out_ch else None)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (self.downsample(x) if self.downsample is not None else x))


class ResNet50(nn.Module):
    """torchvision.models.resnet50's layout and names (written out: the bench's venv has PyTorch
    alone): 7x7 stride-2 stem, BN, ReLU, 3x3 stride-2 max-pool, bottleneck stages 3-4-6-3."""

    def __init__(self, num_classes=1000, in_channels=3):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        layers, in_ch = [], 64
        for i, (width, blocks) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3))):
            stage = []
            for b in range(blocks):
                stage.append(Bottleneck(in_ch, width, stride=2 if b == 0 and i > 0 else 1))
                in_ch = width * 4
            layers.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.fc = nn.Linear(2048, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, stride=2, padding=1)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def synthetic_data(spec, seed):
    """--data synthetic:HxWxC:N:K, as dptrain draws it in shape (N training, ceil(N/10) test images,
    labels in 0..K-1); the values are torch's own random draw (only their speed matters)."""
    shape, n, k = spec[len("synthetic:"):].split(":")
    h, w, c = (int(v) for v in shape.split("x"))
    n, k = int(n), int(k)
    g = torch.Generator().manual_seed(seed)
    def split(count):
        x = torch.randint(0, 256, (count, c, h, w), generator=g, dtype=torch.uint8).float() / 255
        return x, torch.randint(0, k, (count,), generator=g)
    return (*split(n), *split((n + 9) // 10)), k, c


def build_model(name, num_classes=10, in_channels=1):
    if name == "resnet50":
        return ResNet50(num_classes, in_channels)
    if name == "lenet":
        m = LeNet()
        n = sum(p.numel() for p in m.parameters())
        assert n == LENET_PARAMS, f"lenet has {n} params, expected {LENET_PARAMS}"
        return m
    if name == "resnet18":
        return ResNet18(num_classes, in_channels)
    raise ValueError(name)


def init_normal(model, std_of_fan_in):
    """Conv/linear weights ~ N(0, std_of_fan_in(fan_in)^2), biases zero; BN keeps gamma=1, beta=0."""
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.normal_(m.weight, mean=0.0, std=std_of_fan_in(m.weight[0].numel()))
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def init_d2l(model):
    """d2l recipe: N(0, 0.01) weights."""
    init_normal(model, lambda fan_in: 0.01)


def init_kaiming(model):
    """dptrain's default recipe: He (fan-in, ReLU gain) N(0, 2 / fan_in) weights
    (src/nn/model.cc, Model::init_parameters)."""
    init_normal(model, lambda fan_in: math.sqrt(2.0 / fan_in))


RECIPES = {
    # model -> (lr, global batch)
    "d2l": {"lenet": (0.2, 256), "resnet18": (0.1, 256), "resnet50": (0.1, 256)},
    "default": {"lenet": (0.05, 256), "resnet18": (0.1, 256), "resnet50": (0.1, 256)},
}
# recipe -> its initialisation and optimizer, as dptrain's (src/train/config.cc): d2l is plain SGD
# at a constant rate; default is SGD with momentum 0.9 and weight decay 5e-4 on every parameter,
# one epoch of linear warm-up, then cosine decay to 0 at the last epoch's end.
RECIPE_SGD = {
    "d2l": {"init": init_d2l, "momentum": 0.0, "weight_decay": 0.0, "warmup": 0.0, "cosine": False},
    "default": {"init": init_kaiming, "momentum": 0.9, "weight_decay": 5e-4, "warmup": 1.0, "cosine": True},
}


def learning_rate(lr, step, spe, epochs, warmup, cosine):
    """dptrain's schedule (src/train/optimizer.cc, learning_rate) at global step `step` (from 0)."""
    t = step / spe
    if warmup > 0 and t < warmup:
        return lr * (step + 1) / (warmup * spe)
    if not cosine:
        return lr
    u = min(1.0, max(0.0, (t - warmup) / max(1e-9, epochs - warmup)))
    return lr * 0.5 * (1.0 + math.cos(math.pi * u))

# --config name -> (channels-last model and inputs, cudnn.benchmark, torch.compile mode or None).
# "eager" is what this script always ran (and still runs by default, so bench/bench.py's CPU
# suites are unchanged); the others are the steps a user tuning for speed takes, one on another.
# Precision is separate (--tf32, --bf16), so each config runs in strict fp32, TF32 and bf16.
CONFIGS = {
    "eager": (False, False, None),
    "tuned": (True, True, None),
    "compile": (True, True, "max-autotune"),                     # Inductor + CUDA graphs
    "compile-nocg": (True, True, "max-autotune-no-cudagraphs"),
    # The CPU's: Inductor's default mode, which fuses the element-wise work into C++/OpenMP loops
    # and leaves convolutions to oneDNN. (max-autotune has nothing more to offer a CPU training
    # step: CUDA graphs skip CPU tensors, and its one CPU choice, the C++ GEMM template, needs the
    # weights constant -- inference with freezing -- while here they are inputs of the graph.)
    "compile-cpu": (True, False, "default"),
}


# ----------------------------------------------------------------------------- train / eval
def evaluate(model, x, y, autocast, batch=1000):
    """(top-1 accuracy, mean cross-entropy) of model on (x, y) in eval mode; both summed on the
    device and read once at the end (no synchronisation per batch)."""
    model.eval()
    correct = torch.zeros((), dtype=torch.int64, device=x.device)
    loss = torch.zeros((), dtype=torch.float64, device=x.device)
    with torch.no_grad():
        for i in range(0, x.shape[0], batch):
            with autocast():
                z = model(x[i:i + batch])
            correct += (z.argmax(1) == y[i:i + batch]).sum()
            loss += torch.nn.functional.cross_entropy(z.float(), y[i:i + batch], reduction="sum").double()
    return correct.item() / x.shape[0], loss.item() / x.shape[0]


def first_error_line(exc):
    """'Type: first line' of an exception, for the results table. torch.compile wraps a backend's
    error (BackendCompilerFailed says "backend='inductor' raised:" first, the cause after), so
    the wrapped exception is unwrapped and that header line skipped."""
    seen = set()
    while getattr(exc, "inner_exception", None) is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc = exc.inner_exception
    for line in str(exc).splitlines():
        line = line.strip()
        if line and not (line.startswith("backend=") and line.endswith("raised:")):
            return f"{type(exc).__name__}: {line}"[:300]
    return type(exc).__name__


def run(rank, world, args):
    ddp = args.ddp
    channels_last, cudnn_benchmark, compile_mode = CONFIGS[args.config]
    torch.set_num_threads(args.threads)
    if ddp:
        import torch.distributed as dist
        dist.init_process_group("nccl" if args.device == "cuda" else "gloo", rank=rank, world_size=world)
    torch.manual_seed(args.seed)  # same seed on every rank -> same initial weights

    lr_default, batch_default = RECIPES[args.recipe][args.model]
    lr = args.lr if args.lr is not None else lr_default
    gbatch = args.batch_size if args.batch_size is not None else batch_default
    if gbatch % world != 0:
        raise SystemExit(f"global batch {gbatch} not divisible by world size {world}")
    lbatch = gbatch // world

    device = torch.device(args.device)
    if args.device == "cuda":
        # Strict fp32 unless --tf32, which lets cuDNN (convolutions) and cuBLAS (matmuls) use TF32
        # tensor cores: the match for dptrain --tf32, which allows both. (PyTorch's own default is
        # TF32 convolutions and fp32 matmuls.) bf16 autocast is unaffected.
        torch.backends.cudnn.allow_tf32 = args.tf32
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
        # cuDNN times its algorithms for each new shape (in epoch 1, which the tables leave out)
        # instead of taking its heuristic's pick.
        torch.backends.cudnn.benchmark = cudnn_benchmark
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    # bf16 autocast (convolutions and matmuls in bf16, fp32 master weights) on the GPU, or the CPU's
    # (oneDNN's bf16 kernels: AVX512-BF16 or AMX), the match for dptrain --precision bf16.
    def autocast():
        if not args.bf16:
            return contextlib.nullcontext()
        return torch.autocast(args.device, dtype=torch.bfloat16)
    if args.data.startswith("synthetic:"):
        sets, classes, channels = synthetic_data(args.data, args.seed)
    else:
        sets, classes, channels = load_fashion_mnist(args.data), 10, 1
    train_x, train_y, test_x, test_y = (t.to(device) for t in sets)
    model = build_model(args.model, classes, channels)
    sgd = RECIPE_SGD[args.recipe]
    warmup = sgd["warmup"] if args.lr_warmup_epochs is None else args.lr_warmup_epochs
    sgd["init"](model)
    model.to(device)
    if channels_last:
        # NHWC activations and weights: cuDNN's tensor-core kernels work in NHWC, so NCHW costs
        # layout transposes around each convolution; on the CPU oneDNN then runs its NHWC kernels
        # on PyTorch's tensors as they are (bench/bench.py's probe names the kernels of each).
        model.to(memory_format=torch.channels_last)
        train_x = train_x.contiguous(memory_format=torch.channels_last)
        test_x = test_x.contiguous(memory_format=torch.channels_last)
    net = model
    if ddp:
        from torch.nn.parallel import DistributedDataParallel as DDP
        # broadcasts rank 0's parameters/buffers at construction
        net = DDP(model, device_ids=[device.index]) if args.device == "cuda" else DDP(model)
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=sgd["momentum"], weight_decay=sgd["weight_decay"])
    loss_fn = nn.CrossEntropyLoss(reduction="mean")

    def forward_loss(x, y):
        """Forward and loss of one step, and the number of correct predictions."""
        with autocast():
            out = net(x)
            loss = loss_fn(out, y)
        return loss, (out.argmax(1) == y).sum()

    step_forward = forward_loss
    mark_step = None
    error = None                     # set when torch.compile cannot be used: reported, not raised
    if compile_mode:
        if not hasattr(torch, "compile"):
            error = f"did not compile: torch.compile needs PyTorch 2 (this is {torch.__version__})"
        else:
            import torch._dynamo as dynamo   # (not "import torch._dynamo": that makes torch a local)
            dynamo.config.suppress_errors = False   # never fall back to eager unnoticed
            # Logs (stderr) why Inductor did not use CUDA graphs, if it did not (bench/gpu_table.py
            # notes it), and its other performance hints. Older PyTorch logs the first among the
            # hints and has no "cudagraphs" artifact; set_logs replaces all settings at each call.
            for logs in ({"cudagraphs": True, "perf_hints": True}, {"perf_hints": True}):
                try:
                    torch._logging.set_logs(**logs)
                    break
                except (AttributeError, TypeError, ValueError):
                    continue
            # Compiles lazily, at the first call (forward) and the first backward: failures show
            # there. fullgraph: a graph break would leave part of the step eager, unnoticed. Under
            # DDP its forward's own bookkeeping (a logger call, context managers) cannot be traced:
            # the model is compiled as split by Dynamo's DDPOptimizer (at the gradient buckets, so
            # all-reduces overlap backward), DDP's Python around it runs eager.
            # The forward, loss and argmax are one graph; the SGD update stays eager (foreach: a
            # few kernels a step).
            step_forward = torch.compile(forward_loss, mode=compile_mode, fullgraph=not ddp, dynamic=False)
            if compile_mode == "max-autotune":
                # CUDA-graph trees: tell them each step starts a new iteration, so the previous
                # step's graph outputs (loss, gradients) may be overwritten.
                mark_step = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)

    def train_step(idx):
        """One step on the images idx (this rank's share): (loss, correct), on the device."""
        if mark_step is not None:
            mark_step()
        xb, yb = train_x[idx], train_y[idx]
        if channels_last:
            xb = xb.contiguous(memory_format=torch.channels_last)  # a no-op if the gather kept it
        loss, correct = step_forward(xb, yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss, correct

    n_train = train_x.shape[0]
    steps = n_train // gbatch                      # drop_last=True
    if args.max_steps is not None:
        steps = min(steps, args.max_steps)
    name = torch.cuda.get_device_name(device) if args.device == "cuda" else "cpu"
    precision = "bf16" if args.bf16 else ("tf32" if args.tf32 else "fp32")
    # The configuration's fields join the JSON records on the GPU or with a --config other than
    # the default, so bench/gpu_table.py can name each run; the CPU's default output stays as it was.
    detail = args.device == "cuda" or args.config != "eager"
    tags = {"model": args.model, "precision": precision, "config": args.config, "tf32": args.tf32,
            "channels_last": channels_last, "cudnn_benchmark": cudnn_benchmark,
            "compile_mode": compile_mode} if detail else {}
    if rank == 0:
        print(f"# pytorch {torch.__version__} model={args.model} recipe={args.recipe} lr={lr} "
              f"global_batch={gbatch} world={world} threads={args.threads} steps/epoch={steps} "
              f"device={name} bf16={args.bf16} tf32={args.tf32}"
              + (f" config={args.config} channels_last={channels_last} cudnn_benchmark={cudnn_benchmark} "
                 f"compile={compile_mode}" if detail else ""),
              file=sys.stderr, flush=True)
        if detail and args.json:
            # Marks the run as started: a run killed at its time limit leaves this and no epochs.
            print(json.dumps({"type": "start", **tags, "device": name, "epochs": args.epochs,
                              "steps": steps, "framework": "pytorch", "torch": torch.__version__}),
                  flush=True)

    def sync():
        if args.device == "cuda":
            torch.cuda.synchronize()

    def report_error(text):
        print(f"# {args.model} {precision} {args.config}: {text}", file=sys.stderr, flush=True)
        if args.json:
            print(json.dumps({"type": "error", **tags, "error": text, "framework": "pytorch",
                              "device": name}), flush=True)

    if error:
        report_error(error)
        return 3
    first_step_seconds = None
    warmup_seconds = None            # --warmup-steps: their time (compilation, autotuning, set-up)
    # --compile-timeout: a compiler that hangs (or takes longer than a user would wait) becomes a
    # reported error, not a stuck run. A timer thread, since the compiler's own calls cannot be
    # interrupted; os._exit, since a clean exit would wait for them (and for the other DDP ranks).
    watchdog = None
    if compile_mode and args.compile_timeout:
        def expire():
            report_error(f"did not compile: not done after --compile-timeout {args.compile_timeout:g} s")
            os._exit(3)
        watchdog = threading.Timer(args.compile_timeout, expire)
        watchdog.daemon = True
        watchdog.start()

    def compiled():
        if watchdog is not None:
            watchdog.cancel()
    try:
        if args.warmup_steps:
            # Steps before the timed epochs, so that these time the compiled (or primed) step only;
            # the weights, BatchNorm statistics and optimizer state are then put back, so that the
            # epochs train exactly as without. load_state_dict copies into the same tensors, which
            # the compiled graph and DDP's hooks hold.
            saved_model = {k: v.clone() for k, v in model.state_dict().items()}
            saved_opt = copy.deepcopy(opt.state_dict())
            sync()
            t0 = time.perf_counter()
            for j in range(args.warmup_steps):
                base = (j * world + rank) * lbatch % (n_train - lbatch)
                train_step(torch.arange(base, base + lbatch, device=device))
            sync()
            warmup_seconds = time.perf_counter() - t0
            compiled()
            model.load_state_dict(saved_model)
            opt.load_state_dict(saved_opt)
            opt.zero_grad(set_to_none=True)
            if rank == 0 and args.json:
                print(json.dumps({"type": "warmup", **tags, "warmup_steps": args.warmup_steps,
                                  "warmup_seconds": warmup_seconds}), flush=True)
        for epoch in range(1, args.epochs + 1):
            # Same permutation on every rank (seeded by seed+epoch); like DistributedSampler each
            # rank takes the strided shard perm[rank::world], so local batch j of all ranks together
            # is exactly global batch perm[j*B:(j+1)*B].
            g = torch.Generator().manual_seed(args.seed * 1000003 + epoch)
            perm = torch.randperm(n_train, generator=g)[: steps * gbatch]
            shard = perm[rank::world].to(device)
            net.train()
            # loss sum, correct, count; kept on the device so a GPU epoch never waits for the host
            stats = torch.zeros(3, dtype=torch.float64, device=device)
            sync()
            t0 = time.perf_counter()
            tail = torch.zeros((), dtype=torch.float64, device=device)   # --loss-tail's sum
            for j in range(steps):
                for group in opt.param_groups:
                    group["lr"] = learning_rate(lr, (epoch - 1) * steps + j, steps, args.epochs,
                                                warmup, sgd["cosine"])
                loss, correct = train_step(shard[j * lbatch:(j + 1) * lbatch])
                with torch.no_grad():
                    stats[0] += loss.detach().double() * lbatch
                    stats[1] += correct
                    stats[2] += lbatch
                    if j >= steps - args.loss_tail:
                        tail += loss.detach().double()
                if first_step_seconds is None:
                    # Without a warm-up the first step holds torch.compile's compilation and
                    # autotuning (forward at the call, backward at the first backward) or cuDNN's
                    # first search: reported apart. One host sync, in epoch 1 only.
                    sync()
                    first_step_seconds = time.perf_counter() - t0
                    compiled()
            sync()
            epoch_seconds = time.perf_counter() - t0   # training loop only, like d2l's timer
            if ddp:
                dist.all_reduce(stats)
                dist.all_reduce(tail)
            tail_loss = tail.item() / (world * min(args.loss_tail, steps)) if args.loss_tail else None
            # Evaluation: rank 0 only, on the full 10000-image test set, using its own replica
            # (model, not the DDP wrapper or the compiled step, so no collectives and no compile
            # of an eval graph). Other ranks wait at the barrier.
            if rank == 0:
                test_acc = float("nan") if args.no_eval else evaluate(model, test_x, test_y, autocast=autocast)[0]
                train_loss = stats[0].item() / stats[2].item()
                train_acc = stats[1].item() / stats[2].item()
                ips = steps * gbatch / epoch_seconds
                human = (f"epoch {epoch} loss {train_loss:.3f} train acc {train_acc:.3f} "
                         f"test acc {test_acc:.3f}, {epoch_seconds:.1f} s/epoch, {ips:.0f} img/s")
                if detail and epoch == 1:
                    human += f" (first step {first_step_seconds:.2f} s" + (
                        f"; {args.warmup_steps} warm-up steps before, {warmup_seconds:.2f} s)"
                        if warmup_seconds is not None else ")")
                if args.json:
                    print(human, file=sys.stderr, flush=True)
                    rec = {"epoch": epoch, "train_loss": train_loss, "train_acc": train_acc,
                           "test_acc": test_acc, "epoch_seconds": epoch_seconds,
                           "images_per_second": ips, "world_size": world,
                           "framework": "pytorch", "device": name, "bf16": args.bf16}
                    if tail_loss is not None:
                        rec["tail_loss"] = tail_loss   # mean loss of the epoch's last --loss-tail steps
                    if detail:
                        rec.update(type="epoch", **tags)
                        if epoch == 1:
                            rec["first_step_seconds"] = first_step_seconds
                            if warmup_seconds is not None:
                                rec["warmup_seconds"] = warmup_seconds
                    print(json.dumps(rec), flush=True)
                else:
                    print(human, flush=True)
            if ddp:
                dist.barrier()
    except Exception as e:  # noqa: BLE001 -- only for torch.compile's runs, re-raised otherwise
        if not compile_mode:
            raise
        import traceback
        traceback.print_exc()
        # Before the warm-up or the first step ends the failure is the compiler's (or its
        # autotuning's); later it is the compiled step's (a CUDA-graph recording, say).
        done = first_step_seconds is not None or warmup_seconds is not None
        compiled()
        report_error(("failed after compiling: " if done else "did not compile: ") + first_error_line(e))
        return 3
    if ddp:
        dist.destroy_process_group()
    return 0


def _spawn_entry(rank, world, args):
    os.environ["RANK"] = str(rank)
    code = run(rank, world, args)
    if code:
        sys.exit(code)   # torch.multiprocessing then stops the other ranks and raises in main


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def print_params(args):
    model = build_model(args.model)
    for k, v in model.state_dict().items():
        print(f"{k} {list(v.shape)}")
    n = sum(p.numel() for p in model.parameters())
    print(f"# {args.model}: {n} parameters ({len(model.state_dict())} state_dict entries)")


def main():
    p = argparse.ArgumentParser(description=__doc__ or "PyTorch reference for dptrain")
    p.add_argument("--model", choices=["lenet", "resnet18", "resnet50"], default="lenet")
    p.add_argument("--recipe", choices=sorted(RECIPES), default="d2l")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=None, help="global batch (default: recipe)")
    p.add_argument("--lr", type=float, default=None, help="override the recipe's lr")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per process")
    p.add_argument("--max-steps", type=int, default=None, help="limit steps per epoch")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ddp", action="store_true", help="torch.distributed (gloo; NCCL with --device cuda) + DDP")
    p.add_argument("--nproc", type=int, default=None,
                   help="with --ddp: spawn this many local ranks (else use env WORLD_SIZE/RANK)")
    p.add_argument("--json", action="store_true", help="one JSON line per epoch on stdout")
    p.add_argument("--no-eval", action="store_true", help="skip the test-set evaluation (speed runs)")
    p.add_argument("--print-params", action="store_true",
                   help="print state_dict keys/shapes and parameter count, then exit")
    p.add_argument("--data", default=DATA_DIR_DEFAULT,
                   help="Fashion-MNIST IDX .gz directory, or synthetic:HxWxC:N:K (random images)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: one GPU per process (rank mod visible GPUs); DDP then uses NCCL")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (GPU, or CPU autocast with oneDNN's bf16 kernels)")
    p.add_argument("--tf32", action="store_true",
                   help="let cuDNN and cuBLAS use TF32 tensor cores for fp32 convolutions and matmuls, like "
                        "dptrain --tf32 (GPU only; without it, strict fp32)")
    p.add_argument("--config", choices=list(CONFIGS), default="eager",
                   help="how PyTorch runs. eager (default): NCHW, cudnn.benchmark off. tuned: "
                        "channels-last model and inputs, cudnn.benchmark on. compile: tuned, with the "
                        "step's forward+loss under torch.compile(mode='max-autotune') (Inductor, "
                        "autotuned kernels, CUDA graphs). compile-nocg: the same with mode "
                        "'max-autotune-no-cudagraphs'. Epoch 1 holds compilation and autotuning "
                        "(its first step is reported apart, as first_step_seconds); a compile "
                        "failure is reported ('did not compile: ...', JSON type 'error') and the "
                        "exit status is 3. compile* need PyTorch 2. compile-cpu: channels-last under "
                        "torch.compile's default mode (Inductor's C++ loops; the CPU's)")
    p.add_argument("--lr-warmup-epochs", type=float, default=None,
                   help="the learning rate's linear warm-up, in epochs (default: the recipe's; "
                        "dptrain's --warmup-epochs)")
    p.add_argument("--loss-tail", type=int, default=0,
                   help="also report (JSON tail_loss) the mean training loss of each epoch's last N steps")
    p.add_argument("--warmup-steps", type=int, default=0,
                   help="untimed steps before epoch 1, after which weights, BatchNorm statistics and "
                        "optimizer state are restored: the epochs then time the compiled step only "
                        "(JSON: warmup_seconds)")
    p.add_argument("--compile-timeout", type=float, default=0,
                   help="with a compile config: report 'did not compile' and exit 3 if compilation "
                        "(the warm-up, or else the first step) is not done after this many seconds")
    args = p.parse_args()

    if args.print_params:
        print_params(args)
        return
    torch.set_num_interop_threads(1)
    if not args.ddp:
        sys.exit(run(0, 1, args))   # 3: torch.compile failed (reported in the output, not raised)
    if args.nproc is not None:
        import torch.multiprocessing as mp
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        os.environ["WORLD_SIZE"] = str(args.nproc)
        try:
            mp.spawn(_spawn_entry, args=(args.nproc, args), nprocs=args.nproc, join=True)
        except mp.ProcessExitedException as e:   # a compile error is reported in its output
            print(f"torch_ref.py: {e}", file=sys.stderr, flush=True)   # or a rank's crash, here
            sys.exit(e.exit_code if e.exit_code and e.exit_code > 0 else 1)
    else:
        for k in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT"):
            if k not in os.environ:
                raise SystemExit(f"--ddp without --nproc needs env {k}")
        sys.exit(run(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args))


if __name__ == "__main__":
    main()
