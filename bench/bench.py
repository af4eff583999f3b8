#!/usr/bin/env python3
"""Side-by-side benchmarks of dptrain against PyTorch on the same work.

Each suite is a list of named commands that print JSON lines with `epoch_seconds` (dptrain's
--metrics file, torch_ref.py --json). The commands are run alternately, forwards then backwards
(A B C, C B A, ...) so machine noise and position hit all of them alike; the table shows medians, spread and the ratio to the suite's
baseline. Suites:
  lenet-1rank  LeNet, d2l recipe, 1 epoch, 1 rank, 1 and 2 threads: dptrain vs PyTorch
  lenet-dp     LeNet, d2l recipe, 1 epoch, 1 thread per rank: dptrain np1, np2 with overlap on
               and off, PyTorch DDP (gloo) np2; also dptrain's all-reduce time and exposed part; on
               a CPU with AVX512-BF16 or AMX also --precision bf16 against CPU autocast bf16
  resnet-dp    ResNet-18, d2l recipe, global batch 128, 2 ranks x 1 thread, --max-steps steps
               (default 10), no evaluation: dptrain vs PyTorch DDP (gloo); compare images/s; on a
               CPU with AVX512-BF16 or AMX also --precision bf16 against the newest PyTorch's CPU
               autocast bf16
  resnet50-syn ResNet-50 (torchvision's layout, ImageNet stem) on --data synthetic:224x224x3:320:256
               (256 classes on both sides, as in the figures recorded while labels were bytes),
               global batch 32, 2 ranks x 1 thread, --max-steps steps (default 10), no evaluation:
               dptrain vs PyTorch DDP (gloo) in each configuration; bf16 rows as resnet-dp's
  allreduce    raw MPI_Allreduce vs dptrain's Reducer, 4 KiB..64 MiB, 2 ranks (build/bench/allreduce_bench)
  conv         ResNet-18's stride-1 3x3 convolutions: oneDNN direct vs Winograd, per pass, batch 64
               (build/bench/conv_bench)
  step         one training step broken down (forward, backward, data, exposed all-reduce,
               optimizer) from dptrain's --trace at 2 ranks, LeNet and ResNet-18, and the fraction
               of the all-reduce time hidden behind backward
  augment      the cost of --augment crop,flip --normalize auto (fused into the batch gather):
               LeNet 1 epoch and ResNet-18 --max-steps steps (default 10), 2 ranks x 1 thread,
               with and without, on Fashion-MNIST
  all          every suite above, one table each
  builds       this build against another dptrain binary (--baseline PATH, e.g. a copy of the
               previous commit's build/dptrain), alternated: LeNet 1 epoch and ResNet-18 --max-steps
               steps (default 10), 2 ranks x 1 thread; for refactors that must not cost speed
PyTorch: the suites that run it (lenet-1rank, lenet-dp, resnet-dp, resnet50-syn) run the newest release on
PyPI, installed with pip into a virtual environment the bench creates once and reuses
(bench/.venv-torch, git-ignored), in each of bench/torch_ref.py's CPU configurations
(--torch-configs, default eager,tuned,compile-cpu): its default (NCHW, eager), channels-last, and
channels-last under torch.compile (Inductor's default mode); in bf16, CPU autocast in each. Debian's
python3-torch (1.13) runs its default beside them, an extra row (`--torch debian` or `--torch pypi`
runs one of the two). Each dptrain row's ratio is against the fastest of the PyTorch rows it is
compared with (named), with the newest PyTorch's default beside it. A compile row compiles in 2
untimed warm-up steps (torch_ref.py --warmup-steps; the epoch then times the compiled step, its
weights restored) within --compile-timeout seconds (default 600): a compiler that fails, crashes or
hangs is a row "did not compile: <first error line>", not a failure of the bench.
Before its tables the bench says where it ran: the CPU (model, family/model, the vector features
that pick code paths), the instruction-set level dptrain's own loops dispatched to (the debug line
of a one-step run: src/cpu/isa.h; DPT_ISA lowers it) and oneDNN's, and for each PyTorch the ISA its
oneDNN reported and the convolution kernels it ran, fp32 and under CPU bf16 autocast, NCHW and
channels-last (a small probe with ONEDNN_VERBOSE, in the same interpreter the suite runs).
Usage: bench/bench.py SUITE [--reps 3] [--build build] [--json] [--max-steps N] [--baseline PATH]
                            [--torch both|debian|pypi] [--torch-configs eager,tuned,compile-cpu]
                            [--compile-timeout 600]
"""
import argparse
import collections
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEBIAN_PY = "/usr/bin/python3"  # Debian's python3-torch (a measuring tool only)
VENV = os.path.join(ROOT, "bench", ".venv-torch")


def torch_version(py):
    p = subprocess.run([py, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True)
    return p.stdout.strip().split("+")[0] if p.returncode == 0 else None


def pypi_python():
    """(python, torch version) of the venv with the newest PyTorch from PyPI: created on first use,
    then reused."""
    py = os.path.join(VENV, "bin", "python3")
    v = torch_version(py) if os.path.exists(py) else None
    if v:
        return py, v
    print(f"# bench.py: installing the newest PyTorch from PyPI into {VENV} (once; about 5 GB)",
          file=sys.stderr, flush=True)
    if not os.path.exists(py):
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
    p = subprocess.run([py, "-m", "pip", "install", "--disable-pip-version-check", "-q", "--upgrade",
                        "torch", "numpy"])
    v = torch_version(py) if p.returncode == 0 else None
    if not v:
        sys.exit(f"bench.py: pip could not install torch into {VENV} (network? python3-venv?); "
                 "--torch debian runs without it")
    return py, v


def torch_pythons(which):
    """[(label, python)] for --torch: Debian's 1.13 and/or PyPI's newest, labelled by version."""
    out = []
    if which in ("both", "pypi"):
        py, v = pypi_python()
        out.append((f"pytorch{v}", py))
    if which in ("both", "debian"):
        v = torch_version(DEBIAN_PY)
        if v:
            out.append((f"pytorch{v}", DEBIAN_PY))
        elif which == "debian":
            sys.exit("bench.py: Debian's python3-torch is not installed (apt-get install python3-torch)")
        else:
            print("# bench.py: Debian's python3-torch is not installed, so only PyPI's PyTorch runs "
                  "(apt-get install python3-torch adds 1.13)", file=sys.stderr, flush=True)
    return out


# The vector features that choose code paths (dptrain's loops, oneDNN's kernels), as /proc/cpuinfo
# names them.
CPU_FEATURES = ["avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "amx_tile",
                "amx_bf16"]


def cpu_line():
    """'AMD EPYC (family 25 model 17), 2 cores; avx2 fma avx512f ...; no amx_tile amx_bf16'."""
    info = {}
    for line in open("/proc/cpuinfo"):
        k, _, v = line.partition(":")
        info.setdefault(k.strip(), v.strip())
    flags = set(info.get("flags", "").split())
    have = [f for f in CPU_FEATURES if f in flags]
    lack = [f for f in CPU_FEATURES if f not in flags]
    return (f"{info.get('model name', '?')} (family {info.get('cpu family', '?')} model {info.get('model', '?')}), "
            f"{os.cpu_count()} cores; {' '.join(have) or 'none of ' + ' '.join(CPU_FEATURES)}"
            + (f"; no {' '.join(lack)}" if have and lack else ""))


def dptrain_isa(binary, env):
    """The level dptrain's loops dispatched to and oneDNN's ISA, from the debug line of a one-step
    LeNet run ('avx512 (CPU: avx512; oneDNN: avx512_core_bf16)'), or why there is none."""
    p = subprocess.run([binary, "--model", "lenet", "--epochs", "1", "--max-steps", "1", "--eval-every", "0",
                        "--threads", "1", "--log-level", "debug"], env=env, capture_output=True, text=True)
    for line in p.stderr.splitlines():
        if "debug: CPU loops: " in line:
            return line.split("debug: CPU loops: ", 1)[1].strip()
    return f"not reported (exit {p.returncode}; a build before the dispatch of src/cpu/isa.h?)"


# Runs one ResNet-sized convolution forward and backward in fp32 and under CPU bf16 autocast, in
# NCHW (torch_ref.py's eager) and channels-last (its tuned and compile-cpu), with oneDNN's verbose
# log on; prints ATen's own vector level as JSON. What it ran is read from the log.
TORCH_PROBE = """
import json, torch
torch.set_num_threads(1)
conv = torch.nn.Conv2d(64, 64, 3, padding=1)
x = torch.randn(8, 64, 28, 28)
for layout in ("NCHW", "channels-last"):
    if layout == "channels-last":
        conv = conv.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    xg = x.clone().requires_grad_()
    print("probe: fp32 " + layout, flush=True)
    conv(xg).sum().backward()
    print("probe: bf16 " + layout, flush=True)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = conv(xg)
        y.float().sum().backward()
    except Exception as e:  # a torch without CPU autocast
        print("probe: bf16 failed:", e, flush=True)
cap = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
if cap:
    cap = cap()
else:  # PyTorch 1.x: only the build summary says it
    cap = next((l.split(":", 1)[1].strip() for l in torch.__config__.show().splitlines()
                if "CPU capability usage" in l), "?")
print("probe: " + json.dumps({"aten": cap, "mkldnn": torch.backends.mkldnn.is_available()}), flush=True)
"""


def torch_isa(py, env):
    """'oneDNN "<its ISA line>"; fp32 conv <impls>; bf16 autocast conv <impls>; ATen <level>' of one
    PyTorch, or why the probe could not tell."""
    penv = dict(env, ONEDNN_VERBOSE="1", DNNL_VERBOSE="1", OMP_NUM_THREADS="1")
    p = subprocess.run([py, "-c", TORCH_PROBE], env=penv, capture_output=True, text=True)
    isa, phase, aten = "?", None, "?"
    impls = {f"{p} {l}": [] for l in ("NCHW", "channels-last") for p in ("fp32", "bf16")}
    for line in p.stdout.splitlines():
        # oneDNN 3.x writes "onednn_verbose,v1,primitive,exec,..." (and "...,v1,info,..."): its
        # version and kind fields dropped, the line reads as 2.x's "onednn_verbose,exec,...".
        f = [x for x in line.split(",") if x not in ("v1", "primitive")]
        if line.startswith("probe: "):
            word = line[len("probe: "):]
            if word in impls:
                phase = word
            elif word.startswith("{"):
                aten = json.loads(word).get("aten", "?")
        elif len(f) > 3 and f[0] in ("onednn_verbose", "dnnl_verbose"):
            if f[1] == "info" and any(x.startswith("isa:") for x in f):
                isa = next(x for x in f if x.startswith("isa:"))[4:]
            elif f[1] == "exec" and phase and "convolution" in f:
                impl = f[f.index("convolution") + 1]
                if impl not in impls[phase]:
                    impls[phase].append(impl)
    if p.returncode != 0:
        return f"probe failed (exit {p.returncode}): {p.stderr.strip().splitlines()[-1:]}"
    conv = "; ".join(f"{k.replace('bf16', 'bf16 autocast')} conv {' '.join(v) or 'no oneDNN kernel'}"
                     for k, v in impls.items())
    return f'oneDNN "{isa}"; {conv}; ATen {aten}'


def print_where(a, env, suites):
    """The lines that say where the bench ran (see the module's docstring); a JSON record with --json."""
    where = {"cpu": cpu_line(), "dptrain": dptrain_isa(os.path.join(a.build, "dptrain"), env)}
    if "builds" in suites and a.baseline:
        where["baseline"] = dptrain_isa(a.baseline, env)
    if any(s in TORCH_SUITES for s in suites):
        for label, py in torch_pythons(a.torch):
            where[label] = torch_isa(py, env)
    if a.json:
        print(json.dumps({"where": where}))
        return
    for k, v in where.items():
        print(f"# {k}: {v}")
    print(flush=True)


def bf16_cpu():
    """Whether this CPU has the bf16 instructions dptrain's --precision bf16 needs."""
    flags = open("/proc/cpuinfo").read()
    return " avx512_bf16" in flags or " amx_bf16" in flags


def mpirun(np):
    cmd = ["mpirun", "-np", str(np), "--bind-to", "none"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    if np > os.cpu_count():
        cmd.append("--oversubscribe")
    return cmd


# PyTorch's configurations in the comparing suites (bench/torch_ref.py --config; --torch-configs
# changes the list): its default as a user first writes it (NCHW, eager: the tables' "default"),
# channels-last, and channels-last under torch.compile in Inductor's default mode ("compile-cpu";
# why not max-autotune: torch_ref.py's CONFIGS). Each dptrain row is compared with the fastest.
TORCH_CONFIGS = "eager,tuned,compile-cpu"
# The compile rows' untimed warm-up (torch_ref.py --warmup-steps): the forward compiles at the
# first step, the backward at its first backward; a second step would show a recompilation.
COMPILE_WARMUP_STEPS = 2
# A compile row's whole run is killed this long after its --compile-timeout (which torch_ref.py
# enforces itself, on compilation): the timed epoch after compiling takes under a minute in every
# suite, so only a hang gets here.
RUN_MARGIN_S = 300

# One command of a suite. bound: seconds after which it is killed and shown as a failed row (the
# compile rows); None: its failure stops the bench (dptrain's and the eager rows must run).
Run = collections.namedtuple("Run", "name cmd dptrain bound", defaults=(None,))


def torch_runs(a, torches, ref_args, ddp, suffix=""):
    """The PyTorch rows of one comparison: every --torch-configs configuration of the first of
    torches (the newest), the default one of the others (Debian's 1.13, an extra row)."""
    ref = os.path.join(ROOT, "bench", "torch_ref.py")
    runs = []
    for i, (label, py) in enumerate(torches):
        for cfg in (a.torch_configs if i == 0 else ["eager"]):
            cmd = [py, ref, "--json", "--config", cfg] + ref_args
            bound = None
            if cfg.startswith("compile"):
                cmd += ["--warmup-steps", str(COMPILE_WARMUP_STEPS), "--compile-timeout", f"{a.compile_timeout:g}"]
                bound = a.compile_timeout + RUN_MARGIN_S
            runs.append(Run(f"{label}{'-ddp' if ddp else ''} {cfg}{suffix}", cmd, False, bound))
    return runs


def compared(dptrain_runs, pytorch_runs):
    """The baselines map of a suite: each dptrain run against all of pytorch_runs (the first is
    the newest PyTorch's default)."""
    return {r.name: [p.name for p in pytorch_runs] for r in dptrain_runs}


def bf16_rows(a, torches, dptrain_cmd, ref_args, suffix, ddp=True):
    """(runs, baselines) of --precision bf16 against PyTorch's CPU autocast bf16 in each
    configuration (newest PyTorch only), on a CPU with the bf16 instructions; none elsewhere."""
    if not bf16_cpu():
        return [], {}
    mine = [Run(f"dptrain{suffix} bf16", dptrain_cmd + ["--precision", "bf16"], True)]
    theirs = torch_runs(a, torches[:1], ref_args + ["--bf16"], ddp, f"{suffix} bf16")
    return mine + theirs, compared(mine, theirs)


def suite(name, a, torches=()):
    """(runs, baselines): runs are Run tuples; baselines map a dptrain run to the runs it is
    compared with, the newest PyTorch's default (or the builds suite's baseline) first."""
    build, max_steps, baseline = a.build, a.max_steps, a.baseline
    dp = os.path.join(build, "dptrain")
    common = ["--model", "lenet", "--recipe", "d2l", "--epochs", "1"]
    if max_steps:
        common += ["--max-steps", str(max_steps)]
    if name == "lenet-1rank":
        runs, base = [], {}
        for t in (1, 2):
            cmd = mpirun(1) + [dp] + common + ["--threads", str(t)]
            mine = [Run(f"dptrain np1 t{t}", cmd, True)]
            theirs = torch_runs(a, torches, common + ["--threads", str(t)], False, f" np1 t{t}")
            more, more_base = bf16_rows(a, torches, cmd, common + ["--threads", str(t)], f" np1 t{t}",
                                        ddp=False)
            runs += mine + theirs + more
            base.update(compared(mine, theirs))
            base.update(more_base)
        return runs, base
    if name == "lenet-dp":
        mine = [
            Run("dptrain np1", mpirun(1) + [dp] + common, True),
            Run("dptrain np2 overlap", mpirun(2) + [dp] + common, True),
            Run("dptrain np2 no-overlap", mpirun(2) + [dp] + common + ["--no-overlap"], True),
        ]
        ref_args = common + ["--ddp", "--nproc", "2", "--threads", "1"]
        theirs = torch_runs(a, torches, ref_args, True, " np2")
        runs, base = mine + theirs, compared(mine, theirs)
        more, more_base = bf16_rows(a, torches, mpirun(2) + [dp] + common, ref_args, " np2")
        base.update(more_base)
        return runs + more, base
    if name == "resnet-dp":
        steps = max_steps or 10
        r = ["--model", "resnet18", "--recipe", "d2l", "--epochs", "1", "--batch-size", "128",
             "--max-steps", str(steps)]
        ref_args = ["--no-eval", "--ddp", "--nproc", "2", "--threads", "1"] + r
        mine = [Run("dptrain np2", mpirun(2) + [dp] + r + ["--eval-every", "0"], True)]
        theirs = torch_runs(a, torches, ref_args, True, " np2")
        runs, base = mine + theirs, compared(mine, theirs)
        more, more_base = bf16_rows(a, torches, mpirun(2) + [dp] + r + ["--eval-every", "0"], ref_args, " np2")
        base.update(more_base)
        return runs + more, base
    if name == "resnet50-syn":
        steps = max_steps or 10
        r = ["--model", "resnet50", "--recipe", "d2l", "--epochs", "1", "--batch-size", "32",
             "--max-steps", str(steps), "--data", f"synthetic:224x224x3:{32 * steps}:256"]
        ref_args = ["--no-eval", "--ddp", "--nproc", "2", "--threads", "1"] + r
        mine_cmd = mpirun(2) + [dp] + r + ["--stem", "imagenet", "--eval-every", "0"]
        mine = [Run("dptrain np2", mine_cmd, True)]
        theirs = torch_runs(a, torches, ref_args, True, " np2")
        runs, base = mine + theirs, compared(mine, theirs)
        more, more_base = bf16_rows(a, torches, mine_cmd, ref_args, " np2")
        base.update(more_base)
        return runs + more, base
    if name == "augment":
        steps = max_steps or 10
        aug = ["--augment", "crop,flip", "--normalize", "auto"]
        r = ["--model", "resnet18", "--recipe", "d2l", "--epochs", "1", "--batch-size", "128",
             "--max-steps", str(steps), "--eval-every", "0"]
        l = ["--model", "lenet", "--recipe", "d2l", "--epochs", "1", "--eval-every", "0"]
        runs = [
            Run("lenet np2 augmented", mpirun(2) + [dp] + l + aug, True),
            Run("lenet np2 plain", mpirun(2) + [dp] + l, True),
            Run("resnet18 np2 augmented", mpirun(2) + [dp] + r + aug, True),
            Run("resnet18 np2 plain", mpirun(2) + [dp] + r, True),
        ]
        return runs, {"lenet np2 augmented": ["lenet np2 plain"], "resnet18 np2 augmented": ["resnet18 np2 plain"]}
    if name == "builds":
        if not baseline or not os.access(baseline, os.X_OK):
            sys.exit("bench.py: the builds suite needs --baseline PATH, an executable dptrain")
        steps = max_steps or 10
        r = ["--model", "resnet18", "--recipe", "d2l", "--epochs", "1", "--batch-size", "128",
             "--max-steps", str(steps), "--eval-every", "0"]
        l = ["--model", "lenet", "--recipe", "d2l", "--epochs", "1"]
        runs = [
            Run("lenet np2 this", mpirun(2) + [dp] + l, True),
            Run("lenet np2 baseline", mpirun(2) + [baseline] + l, True),
            Run("resnet18 np2 this", mpirun(2) + [dp] + r, True),
            Run("resnet18 np2 baseline", mpirun(2) + [baseline] + r, True),
        ]
        return runs, {"lenet np2 this": ["lenet np2 baseline"], "resnet18 np2 this": ["resnet18 np2 baseline"]}
    sys.exit(f"bench.py: unknown suite '{name}'")


def json_records(text):
    """The JSON objects among the lines of text (the rest is logging)."""
    recs = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                recs.append(json.loads(line))
            except ValueError:
                pass
    return recs


def kill_group(p):
    """Kills what is left of a run started in a session of its own: its ranks and the compiler's
    worker processes, which outlive a killed parent."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def why_failed(returncode, stderr):
    """'exit N: <last line of stderr>' (a Python traceback ends with its exception), or the signal."""
    if returncode is not None and returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    lines = [l.strip() for l in stderr.splitlines() if l.strip()]
    return f"exit {returncode}" + (f": {lines[-1][:200]}" if lines else "")


def measure(run, env, metrics):
    """(record, error, output) of one run: its last record with epoch_seconds, or why there is
    none. A run with a bound runs in a session of its own and is killed with all its processes
    after bound seconds."""
    cmd = run.cmd + (["--metrics", metrics, "--quiet"] if run.dptrain else [])
    # Output to files, not pipes: the compiler's processes inherit them and may outlive the run,
    # and a pipe would then not end until they do.
    with tempfile.TemporaryFile("w+") as fo, tempfile.TemporaryFile("w+") as fe:
        p = subprocess.Popen(cmd, env=env, stdout=fo, stderr=fe, text=True,
                             start_new_session=run.bound is not None)
        timed_out = False
        try:
            p.wait(timeout=run.bound)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            if run.bound is not None:
                kill_group(p)
            p.wait()
        fo.seek(0)
        fe.seek(0)
        out, err = fo.read(), fe.read()
    recs = json_records(open(metrics).read() if run.dptrain and os.path.exists(metrics) else out)
    output = f"{out[-2000:]}{err[-2000:]}"
    # torch_ref.py reports a compile failure itself ("did not compile: ...", JSON type "error");
    # a kill or a crash is named here, before or after its warm-up (record type "warmup") ended.
    stage = "failed after compiling" if any(r.get("type") == "warmup" for r in recs) else "did not compile"
    if timed_out:
        return None, f"{stage}: killed after {run.bound:g} s", output
    reported = next((r["error"] for r in recs if r.get("type") == "error"), None)
    if reported:
        return None, reported, output
    rec = next((r for r in reversed(recs) if "epoch_seconds" in r), None)
    if p.returncode != 0 or rec is None:
        why = why_failed(p.returncode, err) if p.returncode != 0 else "no JSON record with epoch_seconds"
        return None, (f"{stage}: {why}" if run.bound is not None else why), output
    return rec, None, output


def run_binary(a, env, cmd, what):
    """Prints the table (or, with --json, the JSON lines) of one of the compiled benchmarks."""
    p = subprocess.run(cmd + (["--json"] if a.json else []), env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"bench.py: {what} failed ({p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    print(p.stdout, end="")


def run_allreduce(a, env):
    """The all-reduce table of build/bench/allreduce_bench (it alternates nothing: one binary
    times both on the same buffer)."""
    cmd = mpirun(2) + [os.path.join(a.build, "bench", "allreduce_bench"), "--iters", str(max(20, 10 * a.reps))]
    run_binary(a, env, cmd, "allreduce_bench")


STEP_SPANS = ["data", "forward", "backward", "wait for all-reduce", "optimizer"]


def run_step(a, env):
    """Per-step time of each phase on rank 0, from --trace (medians over reps), and the share of
    the bucket all-reduce time (communication thread) that overlapped backward."""
    cases = [("lenet", ["--model", "lenet", "--recipe", "d2l", "--max-steps", "60"], "10:60"),
             ("resnet18", ["--model", "resnet18", "--recipe", "d2l", "--batch-size", "128",
                           "--max-steps", "8"], "3:8")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model, args, window in cases:
            per = {k: [] for k in STEP_SPANS + ["allreduce", "hidden_pct"]}
            for rep in range(a.reps):
                print(f"# rep {rep + 1}/{a.reps}: step {model}", file=sys.stderr, flush=True)
                trace = os.path.join(tmp, "t.json")
                cmd = mpirun(2) + [os.path.join(a.build, "dptrain")] + args + [
                    "--epochs", "1", "--eval-every", "0", "--quiet", "--trace", trace, "--trace-steps", window]
                p = subprocess.run(cmd, env=env, capture_output=True, text=True)
                if p.returncode != 0:
                    sys.exit(f"bench.py: step {model} failed ({p.returncode}):\n{p.stderr[-2000:]}")
                t = json.load(open(trace))
                ev = t["traceEvents"] if isinstance(t, dict) else t
                b, e = (int(v) for v in window.split(":"))
                steps = e - b
                tot = {k: 0.0 for k in STEP_SPANS + ["allreduce"]}
                for x in ev:
                    if x.get("ph") != "X" or x.get("pid") != 0:
                        continue
                    name = x["name"]
                    if name in tot:
                        tot[name] += x["dur"] / 1000.0
                    elif name.startswith("allreduce bucket"):
                        tot["allreduce"] += x["dur"] / 1000.0
                for k in tot:
                    per[k].append(tot[k] / steps)
                ar, ex = tot["allreduce"], tot["wait for all-reduce"]
                per["hidden_pct"].append(100.0 * max(0.0, 1 - ex / ar) if ar > 0 else 0.0)
            row = {"model": model, "ranks": 2}
            row.update({k: statistics.median(v) for k, v in per.items()})
            rows.append(row)
    if a.json:
        for r in rows:
            print(json.dumps(r))
        return
    print(f"# suite step; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; 2 ranks x 1 thread; "
          f"ms per step on rank 0, medians of {a.reps} runs")
    print(f"# {'model':<10} {'data':>7} {'forward':>8} {'backward':>9} {'exposed':>8} {'optimizer':>9} "
          f"{'allreduce':>9} {'hidden':>7}")
    for r in rows:
        print(f"  {r['model']:<10} {r['data']:>7.2f} {r['forward']:>8.2f} {r['backward']:>9.2f} "
              f"{r['wait for all-reduce']:>8.2f} {r['optimizer']:>9.2f} {r['allreduce']:>9.2f} "
              f"{r['hidden_pct']:>6.0f}%")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("suite")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--baseline", help="another dptrain binary (builds suite)")
    ap.add_argument("--torch", choices=["both", "debian", "pypi"], default="both",
                    help="which PyTorch the comparing suites run (default both)")
    ap.add_argument("--torch-configs", default=TORCH_CONFIGS,
                    help=f"the newest PyTorch's bench/torch_ref.py --config list, eager first (default {TORCH_CONFIGS})")
    ap.add_argument("--compile-timeout", type=float, default=600,
                    help="seconds a compile row may take to compile before it is a 'did not compile' row "
                         "(default 600)")
    a = ap.parse_args()
    a.torch_configs = a.torch_configs.split(",")
    if a.torch_configs[0] != "eager":
        sys.exit("bench.py: --torch-configs starts with eager, PyTorch's default (the tables' 'default' column)")
    if not os.access(os.path.join(a.build, "dptrain"), os.X_OK):
        sys.exit(f"bench.py: {a.build}/dptrain not found (build first)")
    env = dict(os.environ, OMPI_MCA_pml="ob1", OMP_NUM_THREADS="1")
    every = ["allreduce", "conv", "step", "lenet-1rank", "lenet-dp", "resnet-dp", "resnet50-syn",
             "augment"]
    if a.suite not in every + ["all", "builds"]:
        sys.exit(f"bench.py: unknown suite '{a.suite}' ({' | '.join(every + ['builds', 'all'])})")
    suites = every if a.suite == "all" else [a.suite]
    print_where(a, env, suites)
    if a.suite == "all":
        for name in suites:
            run_suite(a, name, env)
            print(flush=True)
        return
    run_suite(a, a.suite, env)


TORCH_SUITES = ("lenet-1rank", "lenet-dp", "resnet-dp", "resnet50-syn")


def run_suite(a, name, env):
    if name == "allreduce":
        return run_allreduce(a, env)
    if name == "step":
        return run_step(a, env)
    if name == "conv":
        return run_binary(a, env, [os.path.join(a.build, "bench", "conv_bench"), "--reps", str(a.reps)],
                          "conv_bench")
    torches = torch_pythons(a.torch) if name in TORCH_SUITES else ()
    runs, baseline = suite(name, a, torches)
    records = {r.name: [] for r in runs}
    failed = {}   # run name -> its first failure (bounded runs only; they are not run again)
    with tempfile.TemporaryDirectory() as tmp:
        # Inductor's on-disk cache, the suite's own unless one is set: the first rep compiles from
        # nothing (as a user's first run does: compile_s), the later reps find it.
        env = dict(env, TORCHINDUCTOR_CACHE_DIR=env.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(tmp, "inductor"))
        for rep in range(a.reps):
            # A B C, then C B A: the slot right after another run was measured 2-3 % slower (an
            # A/A run of one binary in both slots), so every command takes every position alike.
            for i, run in (enumerate(runs) if rep % 2 == 0 else reversed(list(enumerate(runs)))):
                if run.name in failed:
                    continue
                print(f"# rep {rep + 1}/{a.reps}: {run.name}", file=sys.stderr, flush=True)
                # A metrics file of its own: one a failed run did not write is not another's.
                rec, error, output = measure(run, env, os.path.join(tmp, f"{rep}-{i}.jsonl"))
                if error and run.bound is None:
                    sys.exit(f"bench.py: '{run.name}' failed ({error}):\n{output}")
                if error:
                    print(f"# {run.name}: {error}", file=sys.stderr, flush=True)
                    failed[run.name] = error
                else:
                    records[run.name].append(rec)
    rows = []
    for run in runs:
        if run.name in failed:
            rows.append({"name": run.name, "error": failed[run.name]})
            continue
        recs = records[run.name]
        xs = [r["epoch_seconds"] for r in recs]
        med = statistics.median(xs)
        row = {"name": run.name, "median_s": med, "min_s": min(xs), "max_s": max(xs), "reps": len(xs),
               "spread_pct": (max(xs) - min(xs)) / med * 100}
        if "comm_seconds" in recs[0]:
            row["allreduce_s"] = statistics.median(r["comm_seconds"] for r in recs)
            row["exposed_s"] = statistics.median(r["exposed_comm_seconds"] for r in recs)
        if recs[0].get("test_acc") is not None and recs[0]["test_acc"] == recs[0]["test_acc"]:  # not NaN
            row["test_acc"] = recs[-1]["test_acc"]
        if "warmup_seconds" in recs[0]:
            # The largest: the first rep's, which compiled with an empty cache.
            row["compile_s"] = max(r["warmup_seconds"] for r in recs)
        row["images_per_second"] = statistics.median(r["images_per_second"] for r in recs)
        rows.append(row)
    med = {r["name"]: r["median_s"] for r in rows if "median_s" in r}
    for r in rows:
        refs = [ref for ref in baseline.get(r["name"], []) if ref in med]
        if r["name"] not in med or not refs:
            continue
        r["speedups"] = {ref: med[ref] / r["median_s"] for ref in refs}
        # The anchor: the fastest of the runs compared with (for the PyTorch suites, every
        # configuration of every PyTorch); the default is the first, the newest PyTorch as a user
        # first writes it.
        fastest = min(refs, key=med.get)
        r["vs"], r["speedup"] = fastest, r["speedups"][fastest]
        default = baseline[r["name"]][0]
        if default in med:
            r["vs_default"], r["speedup_default"] = default, r["speedups"][default]
    if a.json:
        for r in rows:
            print(json.dumps(r))
        return
    print_table(a, name, rows)


def print_table(a, name, rows):
    """The table of one alternated suite: medians, spread, and each dptrain row's speed against its
    fastest comparison and (PyTorch suites) the newest PyTorch's default; failed rows say why."""
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    width = max(28, max(len(r["name"]) for r in rows))
    print(f"# suite {name}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
          f"{os.cpu_count()} cores, {cpu}; {a.reps} reps alternated; epoch_seconds = training loop")
    if name in TORCH_SUITES:
        print(f"# speed = PyTorch's median s / dptrain's; 'fastest PyTorch' is the quickest of the PyTorch rows "
              f"compared, 'PyTorch default' the newest PyTorch's eager NCHW; compile_s = the compile rows' "
              f"{COMPILE_WARMUP_STEPS} untimed warm-up steps (compilation; the first rep's, from an empty cache)")
        ratio_head = f"{'÷fastest':>8}  {'÷default':>8}  fastest PyTorch"
    else:
        ratio_head = "speedup"
    print(f"# {'run':<{width}} {'median_s':>9} {'min_s':>8} {'max_s':>8} {'spread':>7} {'allreduce_s':>11} "
          f"{'exposed_s':>9} {'test_acc':>8} {'img/s':>8} {'compile_s':>9}  {ratio_head}")
    for r in rows:
        if "error" in r:
            print(f"  {r['name']:<{width}}  {r['error']}")
            continue
        cells = [f"{r[k]:.3f}" if k in r else "-" for k in ("allreduce_s", "exposed_s")]
        cells.append(f"{r['test_acc']:.4f}" if "test_acc" in r else "-")
        comp = f"{r['compile_s']:.1f}" if "compile_s" in r else "-"
        if "vs" not in r:
            ratio = ""
        elif name in TORCH_SUITES:
            default = f"{r['speedup_default']:.2f}x" if "speedup_default" in r else "-"
            ratio = f"{r['speedup']:>7.2f}x  {default:>8}  {r['vs']}"
        else:
            ratio = f"{r['speedup']:.2f}x vs {r['vs']}"
        print(f"  {r['name']:<{width}} {r['median_s']:>9.3f} {r['min_s']:>8.3f} {r['max_s']:>8.3f} "
              f"{r['spread_pct']:>6.1f}% {cells[0]:>11} {cells[1]:>9} {cells[2]:>8} "
              f"{r['images_per_second']:>8.1f} {comp:>9}  {ratio}")


if __name__ == "__main__":
    main()
