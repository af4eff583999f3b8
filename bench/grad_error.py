#!/usr/bin/env python3
# bench/grad_error.py -- accuracy of dptrain's fp32 CPU gradients against float64 PyTorch
# (issue 22, item 4 "Accuracy on every ISA").
#
# For one training step of the d2l ResNet-18 (the first --batch Fashion-MNIST training images,
# BatchNorm batch statistics, mean softmax cross-entropy) on dptrain's own initial weights, it
# prints per parameter tensor the norm-relative error ||g - g64|| / ||g64|| of
#   * dptrain's gradients (bench/grad_error.cc writes them, with the weights, batch and loss), and
#   * PyTorch float32's on the same weights and batch (the baseline),
# against PyTorch float64, and the ratio dptrain / PyTorch-fp32 (the target: <= 4 on every layer).
# The float64 loss must equal dptrain's to ~1e-6 first (it is printed), or the layouts are wrong.
#
# Convolution biases that feed a BatchNorm (every conv but the 1x1 downsample ones) have a zero
# gradient in exact arithmetic (BatchNorm subtracts the batch mean), so their "relative error" is
# noise over noise: the table shows them marked '~' with ||g|| / ||g_weight of that conv|| instead,
# and the summary leaves them out.
#
# Usage (PyTorch venv; runs build/bench/grad_error itself):
#   bench/.venv-torch/bin/python3 bench/grad_error.py                       # default settings
#   bench/.venv-torch/bin/python3 bench/grad_error.py --runs default,wino-off,avx2,generic
#   bench/.venv-torch/bin/python3 bench/grad_error.py --files a.safetensors b.safetensors
# --runs names: default, wino-off (DPT_WINOGRAD=off), avx512, avx2, generic (DPT_ISA=...), or
# any NAME=ENV1=V1+ENV2=V2 (e.g. off-avx2=DPT_WINOGRAD=off+DPT_ISA=avx2). --run 'NAME|ENV=V ...|ARGS'
# (repeatable) adds a setting with extra arguments for the binary, e.g. its diagnosis switches:
#   --run 'fwd-direct||--conv fwd=direct,bwd_data=wino4,bwd_w=wino4'   --run 'bn64||--bn f64'
# --cache DIR keeps the PyTorch reference (float64 and float32 gradients) per weights and batch,
# so a second call with other settings skips the ~1 minute of PyTorch.
import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_ref  # noqa: E402  (the d2l ResNet-18 / LeNet definitions, PyTorch state_dict names)

PRESETS = {
    "default": {},
    "wino-off": {"DPT_WINOGRAD": "off"},
    "avx512": {"DPT_ISA": "avx512"},
    "avx2": {"DPT_ISA": "avx2"},
    "generic": {"DPT_ISA": "generic"},
}
DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32, "U8": np.uint8}


def read_safetensors(path):
    """(metadata, {name: numpy array}) of a safetensors file, parsed by hand (no extra package)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {}) or {}
    base = 8 + n
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        a = np.frombuffer(raw, dtype=DTYPES[e["dtype"]], count=(end - b) // np.dtype(DTYPES[e["dtype"]]).itemsize,
                          offset=base + b)
        out[name] = a.reshape(e["shape"]).copy()
    return meta, out


def parse_run(spec):
    if spec in PRESETS:
        return spec, dict(PRESETS[spec])
    if "=" in spec:
        name, rest = spec.split("=", 1)
        env = {}
        for kv in rest.split("+"):
            k, v = kv.split("=", 1)
            env[k] = v
        return name, env
    raise SystemExit(f"--runs: unknown setting '{spec}' (known: {', '.join(PRESETS)}, or NAME=VAR=VALUE+...)")


def parse_run_arg(spec):
    parts = spec.split("|")
    if len(parts) > 3 or not parts[0]:
        raise SystemExit(f"--run '{spec}': expected NAME|ENV=V ...|ARGS")
    env = dict(kv.split("=", 1) for kv in (parts[1].split() if len(parts) > 1 else []))
    extra = parts[2].split() if len(parts) > 2 else []
    return parts[0], env, extra


def run_binary(binary, name, env_extra, args, tmpdir, extra=()):
    out = os.path.join(tmpdir, f"grads-{name}.safetensors")
    env = dict(os.environ)
    for k in ("DPT_WINOGRAD", "DPT_ISA"):  # each setting starts from the library's defaults
        env.pop(k, None)
    env.update(env_extra)
    env.setdefault("OMP_NUM_THREADS", str(args.dpt_threads))
    cmd = [binary, "--batch", str(args.batch), "--seed", str(args.seed), "--data", args.data,
           "--init", args.init, "--model", args.model, "--out", out, *extra]
    if args.masks and "--relu-masks" not in extra:
        cmd.append("--relu-masks")
    t0 = time.time()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} ({env_extra}) failed:\n{r.stdout}{r.stderr}")
    print(f"# {name}: {' '.join(f'{k}={v}' for k, v in env_extra.items()) or '(no env)'} {' '.join(extra)}: "
          f"{r.stdout.strip()} [{time.time() - t0:.1f} s]", file=sys.stderr)
    return out


class ReluTap:
    """Replaces torch_ref's F.relu during one step: records each call's mask (output > 0) and,
    with `forced` (one bool NCHW tensor per call), applies that mask instead of the input's sign."""

    def __init__(self, forced=None):
        self.forced, self.masks, self.shapes = forced, [], []

    def __call__(self, a):
        i = len(self.masks)
        self.shapes.append(tuple(a.shape))
        if self.forced is not None:
            m = self.forced[i]
            self.masks.append(m)
            return a * m.to(a.dtype)
        self.masks.append((a > 0).detach())
        return torch.relu(a)


def torch_grads(model_name, state, x, y, dtype, tap=None):
    """Loss and {name: grad (float64 numpy)} of one training-mode step in `dtype`."""
    torch.manual_seed(0)
    m = torch_ref.build_model(model_name)
    sd = {k: torch.from_numpy(v) for k, v in state.items()}
    m.load_state_dict(sd, strict=True)
    m = m.to(dtype).train()
    m.zero_grad(set_to_none=True)
    saved = torch_ref.F.relu
    if tap is not None:
        torch_ref.F.relu = tap
    try:
        logits = m(torch.from_numpy(x).to(dtype))
    finally:
        torch_ref.F.relu = saved
    loss = F.cross_entropy(logits, torch.from_numpy(y))
    loss.backward()
    grads = {n: p.grad.detach().to(torch.float64).numpy().copy() for n, p in m.named_parameters()}
    return float(loss.detach().to(torch.float64)), grads, logits.detach().to(torch.float64).numpy()


def reference_key(model_name, state, x, y):
    import hashlib
    h = hashlib.sha256()
    h.update(f"{model_name} {torch.__version__}".encode())
    for k in sorted(state):
        h.update(k.encode())
        h.update(np.ascontiguousarray(state[k]).tobytes())
    h.update(x.tobytes())
    h.update(y.tobytes())
    return h.hexdigest()[:20]


def load_reference(cache, model_name, state, x, y):
    if not cache:
        return None
    path = os.path.join(cache, f"ref-{reference_key(model_name, state, x, y)}.npz")
    if not os.path.exists(path):
        return None
    z = np.load(path)
    g64 = {k[4:]: z[k] for k in z.files if k.startswith("g64.")}
    g32 = {k[4:]: z[k] for k in z.files if k.startswith("g32.")}
    order = [str(n) for n in z["order"]]
    return (float(z["loss64"]), {n: g64[n] for n in order}, z["logits64"], float(z["loss32"]),
            {n: g32[n] for n in order}, float(z["t64"]), float(z["t32"]), z["logits32"])


def save_reference(cache, model_name, state, x, y, ref):
    if not cache:
        return
    os.makedirs(cache, exist_ok=True)
    loss64, g64, logits64, loss32, g32, t64, t32, logits32 = ref
    arrays = {f"g64.{k}": v for k, v in g64.items()}
    arrays.update({f"g32.{k}": v for k, v in g32.items()})
    np.savez(os.path.join(cache, f"ref-{reference_key(model_name, state, x, y)}.npz"), order=np.array(list(g64)),
             loss64=loss64, loss32=loss32, logits64=logits64, logits32=logits32, t64=t64, t32=t32, **arrays)


def dptrain_masks(t, shapes):
    """dptrain's ReLU masks (grad_error --relu-masks: bit-packed NHWC) as bool NCHW tensors."""
    count = sum(1 for k in t if k.startswith("relu_mask."))
    if count != len(shapes):
        raise SystemExit(f"dptrain recorded {count} ReLU masks, PyTorch's forward calls F.relu {len(shapes)} times "
                         "(--masks knows the resnet18 layout only: LeNet fuses its ReLUs into pooling)")
    out = []
    for i, (n, c, h, w) in enumerate(shapes):
        bits = np.unpackbits(t[f"relu_mask.{i}"], bitorder="little")[: n * h * w * c]
        out.append(torch.from_numpy(bits.reshape(n, h, w, c).transpose(0, 3, 1, 2).astype(bool).copy()))
    return out


def mask_section(args, model_name, state, x, y, loaded, order, names, w):
    """Flip counts against float64, and the error left when float64 uses each run's own masks."""
    print()
    print("# ReLU masks: flips against float64 (per ReLU call: stem, then relu(bn1) and relu(join) of each block),")
    print("# and the rounding-only error ||g - g64[masks of that run]|| / ||g64[...]|| (float64 with that run's")
    print("# ReLU decisions: what is left is the arithmetic's own rounding, not the flips).")
    tap64 = ReluTap()
    torch_grads(model_name, state, x, y, torch.float64, tap64)
    tap32 = ReluTap()
    torch_grads(model_name, state, x, y, torch.float32, tap32)
    sets = {"pt32": tap32.masks}
    for name, _, t in loaded:
        if "relu_mask.0" not in t:
            print(f"# {name}: no relu_mask tensors (run the binary with --relu-masks)")
            continue
        sets[name] = dptrain_masks(t, tap64.shapes)
    for name, masks in sets.items():
        flips = [int((a != b).sum()) for a, b in zip(masks, tap64.masks)]
        print(f"# flips {name:<10} total {sum(flips):5d}: {' '.join(str(f) for f in flips)}")
    refs = {}
    for name, masks in sets.items():
        t0 = time.time()
        _, g, _ = torch_grads(model_name, state, x, y, torch.float64, ReluTap(forced=masks))
        refs[name] = g
        print(f"# float64 with {name}'s masks: {time.time() - t0:.0f} s", file=sys.stderr)
    _, g32, _ = torch_grads(model_name, state, x, y, torch.float32)
    cols = [n for n in sets if n != "pt32"]
    head = f"{'parameter':<{w}}{'pt32':>10}" + "".join(f"{c:>10}{'x':>7}" for c in cols)
    print(head)
    print("-" * len(head))
    runs = {n: t for n, _, t in loaded}
    worst = {c: (0.0, None) for c in cols}
    for pn in order:
        if zero_in_exact(pn, names):
            continue
        e32 = rel(g32[pn], refs["pt32"][pn])
        es = [rel(runs[c]["grad." + pn], refs[c][pn]) for c in cols]
        rs = [e / e32 if e32 > 0 else float("inf") for e in es]
        for c, r in zip(cols, rs):
            if r > worst[c][0]:
                worst[c] = (r, pn)
        print(f"{pn:<{w}}{fmt(e32):>10}" + "".join(f"{fmt(e):>10}{r:>7.1f}" for e, r in zip(es, rs)))
    print("-" * len(head))
    for c in cols:
        print(f"# {c}: rounding-only worst ratio {worst[c][0]:.1f} ({worst[c][1]})")


def rel(g, ref):
    d = np.linalg.norm((g.astype(np.float64) - ref).ravel())
    r = np.linalg.norm(ref.ravel())
    return d / r if r > 0 else float("inf")


def zero_in_exact(name, names):
    """Conv biases feeding a BatchNorm (X.convK.bias with an X.bnK beside it): their gradient is 0 in
    exact arithmetic."""
    if not name.endswith(".bias"):
        return False
    head, _, leaf = name[: -len(".bias")].rpartition(".")
    if not leaf.startswith("conv"):
        return False
    return f"{head + '.' if head else ''}bn{leaf[len('conv'):]}.weight" in names


def fmt(v):
    if v is None:
        return "-"
    if not math.isfinite(v):
        return "inf"
    return f"{v:.2e}"


def main():
    ap = argparse.ArgumentParser(description="Per-parameter error of dptrain's fp32 CPU gradients (one ResNet-18 "
                                             "training step) against float64 PyTorch, beside PyTorch float32's.")
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "build", "bench", "grad_error"))
    ap.add_argument("--runs", default="default",
                    help="comma-separated settings to run the binary under (default, wino-off, avx512, avx2, "
                         "generic, NAME=VAR=VALUE+VAR=VALUE)")
    ap.add_argument("--run", action="append", default=[], metavar="'NAME|ENV=V ...|ARGS'",
                    help="a further setting with binary arguments (repeatable)")
    ap.add_argument("--cache", help="directory caching the PyTorch reference per weights and batch")
    ap.add_argument("--files", nargs="*", help="compare these grad_error outputs instead of running the binary")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--init", default="d2l")
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--data", default=torch_ref.DATA_DIR_DEFAULT)
    ap.add_argument("--threads", type=int, default=1, help="PyTorch threads (default 1)")
    ap.add_argument("--dpt-threads", type=int, default=os.cpu_count() or 1,
                    help="OMP_NUM_THREADS for the binary when not set in the environment")
    ap.add_argument("--keep", help="directory to keep the binary's outputs in (default: a temporary one)")
    ap.add_argument("--json", help="also write the table as JSON to this file")
    ap.add_argument("--masks", action="store_true",
                    help="run the binary with --relu-masks and add the flip counts and rounding-only errors "
                         "(one more float64 step per setting)")
    ap.add_argument("--factor", type=float, default=4.0, help="the target ratio (default 4)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    tmp = args.keep or tempfile.mkdtemp(prefix="grad_error.")
    os.makedirs(tmp, exist_ok=True)
    if args.files:
        runs = [(os.path.basename(p).replace(".safetensors", ""), p) for p in args.files]
    else:
        binary = os.path.abspath(args.bin)
        runs = []
        for spec in (args.runs.split(",") if args.runs else []):
            name, env = parse_run(spec.strip())
            runs.append((name, run_binary(binary, name, env, args, tmp)))
        for spec in args.run:
            name, env, extra = parse_run_arg(spec)
            runs.append((name, run_binary(binary, name, env, args, tmp, extra)))

    loaded = [(name, *read_safetensors(path)) for name, path in runs]
    meta0, t0 = loaded[0][1], loaded[0][2]
    x, y = t0["input"], t0["labels"]
    state = {k: v for k, v in t0.items()
             if k not in ("input", "labels", "logits") and not k.startswith(("grad.", "relu_mask."))}
    for name, meta, t in loaded[1:]:
        for k, v in state.items():
            if not np.array_equal(t[k], v):
                raise SystemExit(f"{name}: tensor {k} differs from {loaded[0][0]}'s: not the same weights")
        if not (np.array_equal(t["input"], x) and np.array_equal(t["labels"], y)):
            raise SystemExit(f"{name}: not the same batch as {loaded[0][0]}")

    model_name = meta0.get("model", args.model)
    ref = load_reference(args.cache, model_name, state, x, y)
    if ref is None:
        t_start = time.time()
        loss64, g64, logits64 = torch_grads(model_name, state, x, y, torch.float64)
        t64 = time.time() - t_start
        t_start = time.time()
        loss32, g32, logits32 = torch_grads(model_name, state, x, y, torch.float32)
        t32 = time.time() - t_start
        save_reference(args.cache, model_name, state, x, y, (loss64, g64, logits64, loss32, g32, t64, t32, logits32))
    else:
        loss64, g64, logits64, loss32, g32, t64, t32, logits32 = ref
    print(f"# batch {x.shape[0]}, seed {meta0.get('seed')}, init {meta0.get('init')}; PyTorch {torch.__version__}, "
          f"{torch.get_num_threads()} thread(s): float64 step {t64:.1f} s, float32 {t32:.1f} s")
    print(f"# loss: PyTorch float64 {loss64:.12f}  PyTorch float32 {loss32:.12f}; "
          f"float32 logits rel. error {rel(logits32, logits64):.1e}")
    ok = True
    for name, meta, t in loaded:
        ld = float(meta["loss"])
        lerr = abs(ld - loss64) / abs(loss64)
        logit_err = rel(t["logits"], logits64)
        print(f"# loss: dptrain {name:<10} {ld:.12f}  rel. diff {lerr:.1e}; logits rel. error {logit_err:.1e}  "
              f"[{meta.get('isa')}; DPT_WINOGRAD={meta.get('winograd')}]")
        if lerr > 1e-5:
            ok = False
            print(f"# WARNING: {name}'s loss differs from float64 PyTorch by {lerr:.1e}: layouts or model differ",
                  file=sys.stderr)

    pnames = [k[len("grad."):] for k in t0 if k.startswith("grad.")]
    names = set(pnames)
    if set(g64) != names:
        raise SystemExit(f"parameters differ: only dptrain {sorted(names - set(g64))}, "
                         f"only PyTorch {sorted(set(g64) - names)}")
    order = list(g64)  # PyTorch's registration order

    cols = [n for n, _, _ in loaded]
    w = max(len(n) for n in order) + 2
    head = f"{'parameter':<{w}}{'numel':>9}{'||g64||':>10}{'pt32':>10}" + "".join(
        f"{c:>10}{'x':>7}" for c in cols)
    print(head)
    print("-" * len(head))
    rows = []
    worst = {c: (0.0, None) for c in cols}
    over = {c: [] for c in cols}
    for pn in order:
        ref = g64[pn]
        structural_zero = zero_in_exact(pn, names)
        if structural_zero:
            # Scale: the gradient of the conv's weight (which is not zero) per element.
            wref = g64[pn[: -len(".bias")] + ".weight"]
            scale = np.linalg.norm(wref.ravel())
            e32 = np.linalg.norm(g32[pn].ravel()) / scale
            es = [np.linalg.norm(t["grad." + pn].astype(np.float64).ravel()) / scale for _, _, t in loaded]
        else:
            e32 = rel(g32[pn], ref)
            es = [rel(t["grad." + pn], ref) for _, _, t in loaded]
        ratios = [e / e32 if e32 > 0 else float("inf") for e in es]
        line = f"{pn + (' ~' if structural_zero else ''):<{w}}{ref.size:>9}{np.linalg.norm(ref.ravel()):>10.2e}" \
               f"{fmt(e32):>10}" + "".join(f"{fmt(e):>10}{r:>7.1f}" for e, r in zip(es, ratios))
        print(line)
        rows.append({"param": pn, "numel": int(ref.size), "norm64": float(np.linalg.norm(ref.ravel())),
                     "structural_zero": structural_zero, "pt32": e32,
                     "dptrain": {c: e for c, e in zip(cols, es)}, "ratio": {c: r for c, r in zip(cols, ratios)}})
        if not structural_zero:
            for c, r in zip(cols, ratios):
                if r > worst[c][0]:
                    worst[c] = (r, pn)
                if r > args.factor:
                    over[c].append(pn)
    print("-" * len(head))
    for c in cols:
        r, pn = worst[c]
        print(f"# {c}: worst ratio {r:.1f} ({pn}); {len(over[c])} of {len(order) - sum(r['structural_zero'] for r in rows)}"
              f" tensors over {args.factor:g}x PyTorch fp32")
    if args.masks:
        mask_section(args, model_name, state, x, y, loaded, order, names, w)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"loss64": loss64, "loss32": loss32,
                       "runs": {n: {**m, "loss": float(m["loss"])} for n, m, _ in loaded}, "rows": rows}, f, indent=1)
    if not args.keep and not args.files:
        for _, p in runs:
            os.remove(p)
        os.rmdir(tmp)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
