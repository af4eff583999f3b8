#!/usr/bin/env bash
# On the GPU machine (through the device tool, with .gpu-bundle carried): unpacks the bundle made by
# tests/gpu/device_bundle.sh, finds the machine's own CUDA, cuBLAS, cuDNN and NCCL libraries, and
# runs the GPU suites one by one, each bounded. $OUT gets summary.txt, logs.tar.gz (every step's
# log and metrics: the device tool returns at most 8 files) and, after bench, gpu_table.md.
# Usage: bash tests/gpu/device_run.sh [step...]   steps: env smoke backend kernels ops nccl model cli bench
#        reducer2 convbench (default: all but bench, reducer2 and convbench; bench trains LeNet and ResNet-18 for timing;
#        reducer2 runs the compressed-gradient (--grad-dtype) Reducer check at 2 ranks, host MPI on
#        one GPU, 90 s); convbench times a ResNet-18 step's convolutions per geometry in fp32,
#        tf32 and bf16 (bench/gpu_conv_bench). Step limits add up to 570 s for "env smoke backend
#        kernels ops nccl model", 240 s for "cli" and 500 s for "bench" (which takes about 200 s on
#        an H100), so each group fits one 600 s device call.
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
    cli) step cli 240 bash tests/gpu/test_dptrain_gpu.sh /opt/dpt/bin/dptrain ;;
    convbench) step convbench 120 gpu_conv_bench --model resnet18 --batch 256 --steps 10 ;;
    bench)  # the d2l recipes side by side with eager PyTorch on the same GPU (bench/torch_ref.py)
      d2l=(--recipe d2l --data "$data" --progress off)
      # PyTorch loads its own CUDA libraries: not the ones found for dptrain above. Its fp32 runs
      # are strict fp32 unless --tf32 (PyTorch's own default convolves on TF32): like for like.
      torch=(env -u LD_LIBRARY_PATH python3 bench/torch_ref.py --recipe d2l --device cuda --data "$data")
      # dptrain's epoch records go to NAME.jsonl, PyTorch's (--json) into its log: bench/gpu_table.py
      # reads both.
      m() { echo --metrics "$logs/$1.jsonl"; }
      step bench_lenet 50 dptrain --device cuda --model lenet --epochs 10 "${d2l[@]}" $(m bench_lenet)
      step bench_lenet_eager 50 dptrain --device cuda --model lenet --epochs 10 "${d2l[@]}" --no-cuda-graphs \
        $(m bench_lenet_eager)
      step bench_lenet_torch 50 "${torch[@]}" --model lenet --epochs 10 --json
      step bench_resnet18 50 dptrain --device cuda --model resnet18 --epochs 3 "${d2l[@]}" $(m bench_resnet18)
      step bench_resnet18_bf16 50 dptrain --device cuda --model resnet18 --epochs 3 "${d2l[@]}" --precision bf16 \
        $(m bench_resnet18_bf16)
      step bench_resnet18_tf32 50 dptrain --device cuda --model resnet18 --epochs 3 "${d2l[@]}" --tf32 \
        $(m bench_resnet18_tf32)
      step bench_resnet18_torch 50 "${torch[@]}" --model resnet18 --epochs 3 --json
      step bench_resnet18_torch_tf32 50 "${torch[@]}" --model resnet18 --epochs 3 --tf32 --json
      step bench_resnet18_torch_bf16 50 "${torch[@]}" --model resnet18 --epochs 3 --bf16 --json
      nvidia-smi -L > "$logs/device.txt" 2>&1
      python3 bench/gpu_table.py "$logs" | tee "$out/gpu_table.md" ;;
    *) echo "unknown step $s" ;;
  esac
done
tar -C "$logs" -czf "$out/logs.tar.gz" .
echo "--- summary (logs: logs.tar.gz)"
cat "$out/summary.txt"
