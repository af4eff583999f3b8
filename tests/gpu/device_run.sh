#!/usr/bin/env bash
# On the GPU machine (through the device tool, with .gpu-bundle carried): unpacks the bundle made by
# tests/gpu/device_bundle.sh, finds the machine's own CUDA, cuBLAS, cuDNN and NCCL libraries, and
# runs the GPU suites one by one, each bounded. $OUT gets summary.txt, logs.tar.gz (every step's
# log and metrics: the device tool returns at most 8 files) and, after bench or torchcompile_*,
# gpu_table.md.
# Usage: bash tests/gpu/device_run.sh [step...]   steps: env smoke backend kernels ops nccl model cli bench
#        torchcompile_lenet[_P] torchcompile_resnet18_P (P: fp32, tf32 or bf16; none: all three)
#        reducer2 convbench graphconv graphsmoke graphbench fusedconv fusedbench bench16 (default: all but bench,
#        bench16, torchcompile_*, reducer2, convbench, graph* and fused*; graph* check cuDNN's graph-API convolutions:
#        suite 300 s, smoke 120 s, table 400 s; fusedconv the fused BatchNorm-prologue convolution with genstats
#        (test_fused_conv: against the unfused composition, and ResNet-18's batch-256 sites built or refused by
#        name, 200 s), fusedbench its table against the separate passes (gpu_conv_bench --fused, 150 s); bench trains LeNet and ResNet-18 for timing; bench16 the same in bf16 with 16-bit activations
#        (--activation-dtype bf16), on the legacy and the graph API, under the bench budget, for the same table;
#        reducer2 runs the compressed-gradient (--grad-dtype) Reducer check at 2 ranks, host MPI on
#        one GPU, 90 s); convbench times a ResNet-18 step's convolutions per geometry in fp32,
#        tf32 and bf16 (bench/gpu_conv_bench). Step limits add up to 570 s for "env smoke backend
#        kernels ops nccl model" and 360 s for "cli", so each group fits one 600 s device call.
#        bench and torchcompile_* (bench/gpu_table.py's table: dptrain against the fastest of
#        bench/torch_ref.py's --config runs and against its eager default) are bounded together
#        instead: each step's limit is cut to what is left of 560 s from this script's start
#        (DPT_CALL_BUDGET), and a step with too little left is skipped and says so in summary.txt.
#        Expected on an H100: bench about 6 min (dptrain 7 runs, then PyTorch eager and tuned,
#        each model and precision); torchcompile_lenet about 3-5 min (max-autotune, with and
#        without CUDA graphs, 3 precisions); each torchcompile_resnet18_<precision> about 3-6 min
#        (the first compile autotunes every convolution; the second reuses the on-disk caches).
#        So: one call each, "bench" first; every call rewrites gpu_table.md from the logs this
#        machine holds, and bench/gpu_table.py also takes several calls' unpacked logs.tar.gz.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${OUT:-/tmp/dpt-out}
logs=/tmp/dpt-logs
mkdir -p "$out" "$logs"
bundle=$root/.gpu-bundle
# --no-overwrite-dir: directories that exist keep their modes (an archive's ./ must never make /
# private, which breaks every non-root daemon, munged for one).
[[ -f $bundle/runtime.tar.xz ]] || { echo "no $bundle/runtime.tar.xz: run tests/gpu/device_bundle.sh and carry .gpu-bundle"; exit 1; }
if command -v xz > /dev/null; then
  tar --no-overwrite-dir -C / -xJf "$bundle/runtime.tar.xz"
else  # no xz binary: Python's lzma decompresses
  python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' \
    "$bundle/runtime.tar.xz" | tar --no-overwrite-dir -C / -xf -
fi || { echo "unpacking the bundle failed"; exit 1; }

# The machine's CUDA libraries: the toolkit's first (cudart, cuBLAS and cuBLASLt must come from one
# release), then PyTorch's wheels (cuDNN and NCCL are found only there).
locate() {
  local d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
    [[ -e $d/$1 ]] && { echo "$d/$1"; return; }
  done
  find /opt /usr/local /usr/lib -name "$1" -not -path '/opt/dpt/*' 2>/dev/null | head -1
}
libdirs=/opt/dpt/lib
for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libnccl.so.2; do
  path=$(locate "$lib")
  if [[ -n $path ]]; then
    dir=$(dirname "$path")
    [[ :$libdirs: == *:$dir:* ]] || libdirs=$libdirs:$dir
  else
    echo "MISSING on this machine: $lib" | tee -a "$out/summary.txt"
  fi
done
# cuDNN's runtime-fusion engines (fusedconv) compile their kernels with NVRTC, which cuDNN loads
# itself: its directory joins the path where the machine has it; without it those engines decline.
nvrtc=$(locate libnvrtc.so.13)
if [[ -n $nvrtc ]]; then
  [[ :$libdirs: == *:$(dirname "$nvrtc"):* ]] || libdirs=$libdirs:$(dirname "$nvrtc")
else
  echo "no libnvrtc.so.13 on this machine: cuDNN's runtime-fusion engines will decline" | tee -a "$out/summary.txt"
fi
export LD_LIBRARY_PATH=$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=/opt/dpt/bin:$PATH MPIRUN=/usr/bin/orterun
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1
if [[ -d $bundle/data ]]; then export DPT_TEST_DATA=$bundle/data; fi
data=${DPT_TEST_DATA:-/usr/share/datasets/fashion-mnist}

# step NAME LIMIT command...: full log in $logs/NAME.log, its tail on stdout, "NAME rc=N" in the summary.
step() {
  local name=$1 limit=$2 rc
  shift 2
  echo "=== $name: $*"
  local t0=$SECONDS
  timeout -k 10 "$limit" "$@" > "$logs/$name.log" 2>&1
  rc=$?
  echo "$name rc=$rc ($((SECONDS - t0)) s)" | tee -a "$out/summary.txt"
  tail -n 30 "$logs/$name.log"
}

# --- for bench and torchcompile_* only
# bstep NAME LIMIT command...: step() with LIMIT cut to what is left of the call's budget (15 s
# kept for timeout's kill grace, the table and the logs' archive); skipped with under 20 s left.
call_budget=${DPT_CALL_BUDGET:-560}
bstep() {
  local name=$1 limit=$2 left=$((call_budget - SECONDS - 15))
  shift 2
  if ((left < 20)); then
    echo "$name skipped: the call's $call_budget s budget is spent" | tee -a "$out/summary.txt"
    return
  fi
  step "$name" $((limit < left ? limit : left)) "$@"
}
# PyTorch loads its own CUDA libraries, not the ones found for dptrain above: it runs with the
# machine's own LD_LIBRARY_PATH (where Triton may look for libcuda), without the directories added.
machine_ld=${LD_LIBRARY_PATH#"$libdirs"}
machine_ld=${machine_ld#:}
if [[ -n $machine_ld ]]; then torch_py=(env LD_LIBRARY_PATH="$machine_ld" python3); else torch_py=(env -u LD_LIBRARY_PATH python3); fi
# torch_step MODEL PRECISION CONFIG LIMIT: one bench/torch_ref.py run, its --json lines in
# bench_MODEL_torch_PRECISION_CONFIG.log for bench/gpu_table.py. As many epochs as dptrain's runs
# (LeNet 10, ResNet-18 3), so test accuracies compare too. Strict fp32 unless tf32 (cuDNN and
# cuBLAS on TF32, as dptrain --tf32) or bf16 (autocast, as dptrain --precision bf16).
torch_step() {
  local model=$1 prec=$2 cfg=$3 limit=$4 epochs=10 p=()
  [[ $model == resnet18 ]] && epochs=3
  case $prec in tf32) p=(--tf32) ;; bf16) p=(--bf16) ;; esac
  bstep "bench_${model}_torch_${prec}_${cfg}" "$limit" "${torch_py[@]}" bench/torch_ref.py --recipe d2l \
    --device cuda --data "$data" --model "$model" --epochs "$epochs" --config "$cfg" ${p[@]+"${p[@]}"} --json
}
gpu_table() {
  nvidia-smi -L > "$logs/device.txt" 2>&1
  python3 bench/gpu_table.py "$logs" | tee "$out/gpu_table.md"
}

steps=("$@")
[[ ${#steps[@]} -eq 0 ]] && steps=(env smoke backend kernels ops nccl model cli)
for s in "${steps[@]}"; do
  case $s in
    env) step env 30 bash -c 'nvidia-smi; echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; ldd /opt/dpt/bin/dptrain | grep -E "not found|cudnn|nccl|cublas|cudart"' ;;
    smoke) step smoke 60 dptrain --device cuda --model lenet --epochs 1 --max-steps 3 --eval-every 0 --data "$data" --log-level debug ;;
    # Every operation and layer on the CPU and the CUDA backend against independent references.
    backend) step backend 60 test_backend_ops ;;
    kernels) step kernels 60 test_gpu_kernels ;;
    ops) step ops 90 test_gpu_ops ;;
    nccl) step nccl 60 test_gpu_nccl ;;
    reducer2) step reducer2 90 "$MPIRUN" -np 2 test_gpu_nccl --gtest_filter='GpuReducer.*' ;;
    model) step model 210 test_gpu_model ;;
    cli) step cli 360 bash tests/gpu/test_dptrain_gpu.sh /opt/dpt/bin/dptrain ;;
    convbench) step convbench 120 gpu_conv_bench --model resnet18 --batch 256 --steps 10 ;;
    # cuDNN's graph API (DPT_CUDNN_API=graph, not yet the default): its suite, a 3-step ResNet-18
    # run with the chosen plans logged, and the per-layer table against the legacy API.
    graphconv) step graphconv 300 test_graph_conv ;;
    graphsmoke) step graphsmoke 120 env DPT_CUDNN_API=graph dptrain --device cuda --model resnet18 --epochs 1 \
      --max-steps 3 --eval-every 0 --data "$data" --log-level debug ;;
    graphbench) step graphbench 400 gpu_conv_bench --model resnet18 --batch 256 --steps 10 \
      --modes fp32,tf32,bf16io --api legacy,graph ;;
    # The fused op (src/cuda/cudnn_fused_conv.h, not yet in the layers): its suite prints the plan
    # per key and the ResNet-18 table; fusedbench the fused-against-separate table.
    fusedconv) step fusedconv 200 test_fused_conv ;;
    fusedbench) step fusedbench 150 gpu_conv_bench --fused --batch 256 --steps 20 ;;
    bench16)  # --precision bf16 with 16-bit activations, legacy and graph API: rows beside bench's in gpu_table.md
      d2l=(--recipe d2l --data "$data" --progress off --precision bf16 --activation-dtype bf16)
      m() { echo --metrics "$logs/$1.jsonl"; }
      for model in lenet resnet18; do
        e=$([[ $model == lenet ]] && echo 10 || echo 3)
        bstep bench_${model}_act16_bf16 60 dptrain --device cuda --model $model --epochs $e "${d2l[@]}" \
          $(m bench_${model}_act16_bf16)
        bstep bench_${model}_graph_act16_bf16 90 env DPT_CUDNN_API=graph dptrain --device cuda --model $model \
          --epochs $e "${d2l[@]}" --log-level debug $(m bench_${model}_graph_act16_bf16)
      done
      gpu_table ;;
    bench)  # the d2l recipes: dptrain, then PyTorch eager and tuned on the same GPU (bench/torch_ref.py)
      d2l=(--recipe d2l --data "$data" --progress off)
      # dptrain's epoch records go to NAME.jsonl; bench/gpu_table.py reads the precision from the
      # name's _tf32/_bf16 ("eager" there: --no-cuda-graphs).
      m() { echo --metrics "$logs/$1.jsonl"; }
      bstep bench_lenet 50 dptrain --device cuda --model lenet --epochs 10 "${d2l[@]}" $(m bench_lenet)
      bstep bench_lenet_eager 50 dptrain --device cuda --model lenet --epochs 10 "${d2l[@]}" --no-cuda-graphs \
        $(m bench_lenet_eager)
      bstep bench_lenet_tf32 50 dptrain --device cuda --model lenet --epochs 10 "${d2l[@]}" --tf32 $(m bench_lenet_tf32)
      bstep bench_lenet_bf16 50 dptrain --device cuda --model lenet --epochs 10 "${d2l[@]}" --precision bf16 \
        $(m bench_lenet_bf16)
      bstep bench_resnet18 60 dptrain --device cuda --model resnet18 --epochs 3 "${d2l[@]}" $(m bench_resnet18)
      bstep bench_resnet18_tf32 50 dptrain --device cuda --model resnet18 --epochs 3 "${d2l[@]}" --tf32 \
        $(m bench_resnet18_tf32)
      bstep bench_resnet18_bf16 50 dptrain --device cuda --model resnet18 --epochs 3 "${d2l[@]}" --precision bf16 \
        $(m bench_resnet18_bf16)
      # PyTorch without compilation (each about 10-20 s; ResNet-18 eager fp32 about 35 s), ResNet-18
      # first: were the budget spent, LeNet's would be the runs lost. The torch.compile configs
      # take minutes: torchcompile_* below.
      for model in resnet18 lenet; do
        for prec in fp32 tf32 bf16; do
          for cfg in eager tuned; do
            torch_step $model $prec $cfg $([[ $model$prec == resnet18fp32 ]] && echo 90 || echo 60)
          done
        done
      done
      gpu_table ;;
    torchcompile_*)  # torchcompile_MODEL[_PRECISION]: without a precision, fp32, tf32 and bf16 in turn
      rest=${s#torchcompile_}
      model=${rest%%_*}
      precs=(fp32 tf32 bf16)
      [[ $rest == *_* ]] && precs=("${rest#*_}")
      if [[ $model != lenet && $model != resnet18 ]] || [[ " fp32 tf32 bf16 " != *" ${precs[0]} "* ]]; then
        echo "unknown step $s" | tee -a "$out/summary.txt"
        continue
      fi
      # torch.compile(mode="max-autotune") and "max-autotune-no-cudagraphs", per precision; the
      # first of the two autotunes (minutes for ResNet-18), the second finds the kernels and the
      # autotuning results in Inductor's and Triton's caches under /tmp. A compile failure is a
      # row of the table ("did not compile: ..."), its step rc=3.
      if [[ -z ${torchcompile_env_done-} ]]; then  # what Inductor needs: Triton, a C compiler, Python.h
        torchcompile_env_done=1
        bstep torchcompile_env 60 "${torch_py[@]}" -c 'import os, shutil, sysconfig, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(),
      torch.cuda.get_device_name(0))
try:
    import triton
    print("triton", triton.__version__)
except Exception as e:
    print("triton not importable:", e)
inc = sysconfig.get_paths()["include"]
print("cc", shutil.which("cc"), "gcc", shutil.which("gcc"), "Python.h", os.path.exists(os.path.join(inc, "Python.h")))'
      fi
      limits=(150 120)                                  # LeNet: compile, compile-nocg
      [[ $model == resnet18 ]] && limits=(420 300)
      for prec in "${precs[@]}"; do
        torch_step "$model" "$prec" compile "${limits[0]}"
        torch_step "$model" "$prec" compile-nocg "${limits[1]}"
      done
      gpu_table ;;
    *) echo "unknown step $s" ;;
  esac
done
tar -C "$logs" -czf "$out/logs.tar.gz" .
echo "--- summary (logs: logs.tar.gz)"
cat "$out/summary.txt"
