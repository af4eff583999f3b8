#!/usr/bin/env bash
# The GPU check in one device call (issue 29): a machine lent for 15 minutes in all cannot take a
# runbook of several calls, so everything a GPU alone can show runs here under one hard deadline,
# in order of priority, and every step's result is in $OUT as soon as the step ends.
#
# Usage (repository root on the GPU machine, .gpu-bundle carried; tests/gpu/device_bundle.sh
# makes it here):
#   bash tests/gpu/device_check.sh [check|perf|compile]
#     check (default): A CUDA against the CPU, B cuDNN's graph API, C ResNet-18 end to end beside
#                      PyTorch tuned, D (time left) training parity, the command-line suite, NCCL,
#                      the 2-rank reducer, ResNet-50 at 224x224 beside PyTorch tuned, 64 bf16 plans
#                      a key, ResNet-50's per-kernel profile (ncu; $OUT/profile_resnet50.md), then
#                      ResNet-18's ($OUT/profile.md), the fused convolution.
#     perf:    issue 29's target table: every model and precision, dptrain (graph API, and
#              with --cudnn-nondeterministic beside it for ResNet-18; the legacy API in TF32 and
#              fp32 later) against PyTorch tuned and eager, the 10-epoch bf16 accuracy against TF32.
#     compile: torch.compile max-autotune, LeNet then ResNet-18 (minutes per precision), for a
#              spare call.
# One session's device time (15 minutes) held check and perf as two calls on one warm machine:
# H200 (05:49, 2026-11-26) check 330 s, perf at DPT_DEADLINE=370 360 s; H100 (15:31) check at
# DPT_DEADLINE=540 477 s (timeout_s 580), then perf at DPT_DEADLINE=290 284 s (timeout_s 325),
# 799 s of the 900 with the machine's start; H100 (2026-11-27) check at 540 529 s, then perf at
# DPT_DEADLINE=270 262 s (timeout_s 300), 830 s held: perf's deadline about 70 s under the
# budget_left_s that check's reply gives.
# Time: a deadline of DPT_DEADLINE seconds (default 470) from the script's start. Groups end at
# fixed fractions of it (check: A by 150/470, B by 290/470, so that C keeps at least 160 of 470
# s); each step runs under `timeout -k 5` with the smaller of its cap and what is left of its
# group, and a step with too little left is cut, which summary.txt says. 10 s are kept at the end
# for the table and the archive. Run the device call with timeout_s about 40 s over the deadline.
# Results: $OUT/summary.txt (versions first, then one line per step: group, name, status, seconds,
# failed test names), $OUT/logs.tar.gz (every step's full log, re-packed after each step),
# $OUT/gpu_table.md (bench/gpu_table.py on the runs so far). A call killed at its limit still
# brings back everything up to the step it was in.
# DPT_DRY_RUN=1: no bundle, no GPU: every step is a fake (sleeps half its scaled cap; the steps
# named in DPT_DRY_HANG hang until killed) under a 20 s deadline: tests/gpu/test_device_check.sh
# checks the budget, the cuts, the partial results and the packing with it. Without a bundle or a
# CUDA device (and not dry), the script says so and exits 77, having unpacked nothing.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
list=${1:-check}
case $list in check | perf | compile) ;; *) echo "unknown list '$list': check, perf or compile" >&2; exit 2 ;; esac
dry=${DPT_DRY_RUN:-0}
deadline=${DPT_DEADLINE:-$([[ $dry == 1 ]] && echo 20 || echo 470)}
[[ $deadline =~ ^[0-9]+$ && $deadline -ge 5 ]] || { echo "DPT_DEADLINE=$deadline is not a number of seconds >= 5" >&2; exit 2; }
out=${OUT:-/tmp/dpt-out}
logs=$(mktemp -d /tmp/dpt-logs.XXXXXX)
mkdir -p "$out"
: > "$out/summary.txt"
bundle=${DPT_BUNDLE:-$root/.gpu-bundle}
export PYTHONUNBUFFERED=1

# Milliseconds since the script started (EPOCHREALTIME: bash 5, the locale may write a comma;
# else date's nanoseconds).
usec() { if [[ -n ${EPOCHREALTIME-} ]]; then echo "${EPOCHREALTIME/[.,]/}"; else echo $(($(date +%s%N) / 1000)); fi; }
t_start=$(usec)
now_ms() { echo $((($(usec) - t_start) / 1000)); }
# Line-buffered output where stdbuf exists (coreutils'; a missing one must not fail every step).
unbuffered=()
command -v stdbuf > /dev/null && unbuffered=(stdbuf -oL -eL)
secs() { printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000)); }
# A duration of the real 470 s budget scaled to this deadline, in ms.
scaled() { echo $(($1 * 1000 * deadline / 470)); }
note() { echo "$*" | tee -a "$out/summary.txt"; }
# The archive is replaced whole (written aside, then renamed): a call killed mid-pack still
# brings back the previous one.
pack() {
  cp "$out/summary.txt" "$logs/summary.txt" 2> /dev/null
  tar -C "$logs" -czf "$out/logs.tar.gz.part" . 2> /dev/null && mv "$out/logs.tar.gz.part" "$out/logs.tar.gz"
}

end_ms=$((deadline * 1000 - $(scaled 10) ))  # kept for the table and the archive
min_ms=$(scaled 10)                            # a step with less than this left is cut
((min_ms < 500)) && min_ms=500
group=- group_end=$end_ms
# group NAME END: the steps that follow end by END of the real 470 s budget (scaled).
group() {
  group=$1
  group_end=$(scaled "$2")
  ((group_end > end_ms)) && group_end=$end_ms
  echo "=== group $group (ends by $(secs "$group_end") s; $(secs "$(now_ms)") s used)"
}

# step NAME CAP command...: the command under timeout with min(CAP scaled, what is left of the
# group), its output in $logs/NAME.log; one summary line; the archive re-packed.
step() {
  local name=$1 cap_ms
  cap_ms=$(scaled "$2")
  shift 2
  local t0 left limit rc status
  t0=$(now_ms)
  left=$((group_end - t0))
  limit=$((cap_ms < left ? cap_ms : left))
  if ((limit < min_ms)); then
    note "$(printf '%-2s %-32s CUT      %s s left of the group, %s s needed' "$group" "$name" "$(secs $((left > 0 ? left : 0)))" "$(secs "$min_ms")")"
    return 0
  fi
  echo "--- $name (limit $(secs "$limit") s): $*"
  if [[ $dry == 1 ]]; then
    local nap=$((cap_ms / 2))
    [[ " ${DPT_DRY_HANG-ops graphconv} " == *" $name "* ]] && nap=1000000
    set -- bash -c 'echo "fake $0: $*"; sleep "$1"; echo "[  PASSED  ] 1 test."' "$name" "$(secs "$nap")"
  fi
  timeout -k 5 "$(secs "$limit")" ${unbuffered[@]+"${unbuffered[@]}"} "$@" > "$logs/$name.log" 2>&1
  rc=$?
  local took
  took=$(secs $(($(now_ms) - t0)))
  case $rc in
    0) status=ok ;;
    77) status=skipped ;;
    124 | 137) status="TIMEOUT" ;;
    *) status="FAIL" ;;
  esac
  # What failed, named: gtest's "[  FAILED  ] Suite.Test" lines, and the command-line suite's "FAIL:" count.
  local failed fails
  failed=$(grep -E '^\[  FAILED  \] ' "$logs/$name.log" | awk '$4 ~ /\./ {print $4}' | sort -u | head -12 | tr '\n' ' ')
  fails=$(grep -c '^FAIL:' "$logs/$name.log")
  ((fails > 0)) && failed="$failed$fails FAIL: line(s)"
  note "$(printf '%-2s %-32s %-8s %7s s  rc=%d%s' "$group" "$name" "$status" "$took" "$rc" "${failed:+  failed: $failed}")"
  tail -n 15 "$logs/$name.log"
  pack
}

note "device_check.sh $list: deadline $deadline s, dry run $dry, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2> /dev/null || echo '?')"

# ---- the machine: unpack the bundle, find CUDA's libraries --------------------------------------
if [[ $dry != 1 ]]; then
  if [[ ! -f $bundle/runtime.tar.xz ]]; then
    note "no bundle at $bundle/runtime.tar.xz: GPU steps skipped (make it with tests/gpu/device_bundle.sh and carry .gpu-bundle)"
    pack
    exit 77
  fi
  if [[ ! -e /dev/nvidia0 ]] && ! nvidia-smi -L > /dev/null 2>&1; then
    note "no CUDA device on this machine: GPU steps skipped"
    pack
    exit 77
  fi
  # --no-overwrite-dir: directories that exist keep their modes (the archive's ./ must never make /
  # private). Without an xz binary, Python's lzma decompresses.
  if command -v xz > /dev/null; then
    tar --no-overwrite-dir -C / -xJf "$bundle/runtime.tar.xz"
  else
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' \
      "$bundle/runtime.tar.xz" | tar --no-overwrite-dir -C / -xf -
  fi || { note "unpacking the bundle failed"; pack; exit 1; }
  # The machine's CUDA libraries: the toolkit's first (cudart, cuBLAS and cuBLASLt from one
  # release), then PyTorch's wheels (cuDNN and NCCL are found only there); NVRTC for cuDNN's
  # runtime-compiled engines (the fused convolution), which cuDNN loads itself.
  locate() {
    local d
    for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
      [[ -e $d/$1 ]] && { echo "$d/$1"; return; }
    done
    find /opt /usr/local /usr/lib -name "$1" -not -path '/opt/dpt/*' 2> /dev/null | head -1
  }
  libdirs=/opt/dpt/lib
  for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libnccl.so.2 libnvrtc.so.13; do
    path=$(locate "$lib")
    if [[ -z $path ]]; then note "MISSING on this machine: $lib"; continue; fi
    [[ :$libdirs: == *:$(dirname "$path"):* ]] || libdirs=$libdirs:$(dirname "$path")
  done
  machine_ld=${LD_LIBRARY_PATH-}
  export LD_LIBRARY_PATH=$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PATH=/opt/dpt/bin:$PATH MPIRUN=/usr/bin/orterun
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader
  # 8 threads: the test suites' CPU references (oneDNN, OpenMP) on the machine's 16 cores, also
  # at 2 ranks; dptrain sets its own (--threads).
  export OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=8
  [[ -d $bundle/data ]] && export DPT_TEST_DATA=$bundle/data
else
  machine_ld=${LD_LIBRARY_PATH-}
  MPIRUN=mpirun
fi
data=${DPT_TEST_DATA:-/usr/share/datasets/fashion-mnist}
# PyTorch loads its own CUDA libraries: it runs with the machine's LD_LIBRARY_PATH, not dptrain's.
if [[ -n $machine_ld ]]; then torch_py=(env LD_LIBRARY_PATH="$machine_ld" python3); else torch_py=(env -u LD_LIBRARY_PATH python3); fi

# ---- the runs the lists are made of ----------------------------------------------------------
d2l=(--recipe d2l --data "$data" --progress off)
# dptrain_run NAME CAP EPOCHS API [flags...]: a d2l-recipe run on cuDNN's API (legacy or graph)
# whose --metrics is bench_NAME.jsonl, the name read by bench/gpu_table.py (model first;
# _tf32/_bf16 the precision; graph, act16, eager, plans64 the variants). API may carry more of the
# run's environment after a comma: graph,DPT_CUDNN_MAX_PLANS=64.
dptrain_run() {
  local name=$1 cap=$2 epochs=$3 api=${4%%,*} model=${1%%_*} more=()
  [[ $4 == *,* ]] && IFS=, read -ra more <<< "${4#*,}"
  shift 4
  step "bench_$name" "$cap" env DPT_CUDNN_API="$api" ${more[@]+"${more[@]}"} dptrain --device cuda \
    --model "$model" --epochs "$epochs" "${d2l[@]}" --metrics "$logs/bench_$name.jsonl" "$@"
}
# pytorch MODEL PRECISION CONFIG CAP [EPOCHS]: one bench/torch_ref.py run, its --json lines in
# bench_MODEL_torch_PRECISION_CONFIG.log. Strict fp32 unless tf32 (cuDNN and cuBLAS on TF32, as
# dptrain --tf32) or bf16 (autocast, as --precision bf16).
pytorch() {
  local model=$1 prec=$2 cfg=$3 cap=$4 epochs=${5:-}
  local p=()
  [[ -z $epochs ]] && { epochs=10; [[ $model == resnet18 ]] && epochs=3; }
  case $prec in tf32) p=(--tf32) ;; bf16) p=(--bf16) ;; esac
  step "bench_${model}_torch_${prec}_${cfg}" "$cap" "${torch_py[@]}" bench/torch_ref.py --recipe d2l --device cuda \
    --data "$data" --model "$model" --epochs "$epochs" --config "$cfg" ${p[@]+"${p[@]}"} --json
}
table() {
  [[ $dry == 1 ]] || nvidia-smi -L > "$logs/device.txt" 2>&1
  python3 bench/gpu_table.py "$logs" > "$out/gpu_table.md" 2> "$logs/gpu_table.err" ||
    note "bench/gpu_table.py failed: $(tail -n 1 "$logs/gpu_table.err")"
}
act16=(--precision bf16 --activation-dtype bf16)
# profile NAME CAP A:B dptrain-flags...: ncu on training steps A..B-1 (after the warm-up; CUDA
# graphs' nodes one by one, each kernel alone with cold caches, so shares count, not the sum), the
# per-kernel table (bench/kernel_table.py) in $OUT/NAME.md.
profile() {
  local name=$1 cap=$2 steps=$3
  shift 3
  step "$name" "$cap" bash -c 'set -o pipefail; csv=$1 md=$2 steps=$3
    shift 3
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1)
    [[ -n $ncu ]] || { echo "no ncu on this machine"; exit 77; }
    DPT_PROFILE_STEPS=$steps "$ncu" --profile-from-start off --graph-profiling node --clock-control none \
      --metrics gpu__time_duration.sum --csv --print-units base \
      dptrain --device cuda --eval-every 0 --progress off "$@" > "$csv" &&
      python3 bench/kernel_table.py "$csv" $((${steps#*:} - ${steps%:*})) 40 | tee "$md"' \
    _ "$logs/$name.csv" "$out/$name.md" "$steps" "$@"
}

case $list in
  check)
    group A 150  # CUDA against the CPU
    # Versions first: the libraries dptrain loaded (its --log-level debug banner) and where from.
    step versions 30 bash -c 'nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
      echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; ldd "$(command -v dptrain)" | grep -E "not found|cudnn|nccl|cublas|cudart"
      dptrain --device cuda --model lenet --epochs 1 --max-steps 2 --eval-every 0 --data "$0" --log-level debug' "$data"
    [[ $dry == 1 ]] || grep -E "CUDA runtime .*cuDNN|not found" "$logs/versions.log" | head -3 | sed 's/^/   /' | tee -a "$out/summary.txt"
    step backend 60 env DPT_CUDNN_API=legacy test_backend_ops --gtest_filter='*/cuda'  # every op and layer: fp32, bf16, fused BN
    step kernels 30 test_gpu_kernels
    step ops 60 test_gpu_ops
    step model 90 test_gpu_model --gtest_filter='GpuModel.*'  # LeNet and ResNet-18 against the CPU, small batch
    group B 290  # cuDNN's graph API (the default since 2026-11-26)
    step backend_graph 60 env DPT_CUDNN_API=graph test_backend_ops --gtest_filter='*/cuda'
    step graphconv 100 test_graph_conv
    step graphbench 60 gpu_conv_bench --model resnet18 --batch 256 --steps 5 --modes tf32,bf16io --api legacy,graph
    group C 470  # end to end: ResNet-18 --precision bf16, 3 epochs, beside PyTorch tuned
    dptrain_run resnet18_graph_act16_bf16 70 3 graph "${act16[@]}" --log-level debug
    pytorch resnet18 bf16 tuned 70
    dptrain_run resnet18_legacy_act16_bf16 50 3 legacy "${act16[@]}"
    dptrain_run resnet18_legacy_bf16 50 3 legacy --precision bf16 --activation-dtype fp32
    pytorch resnet18 bf16 eager 60
    table
    group D 470  # only with time left
    # First what no GPU has run yet: CUDA graphs over the pool's buffers (captured only after an
    # eager step that allocated nothing), evaluation graphs, the graph-API checkpoint and resume.
    step training 200 test_gpu_model --gtest_filter='GpuTraining.*:GpuReducer.*:StreamGraph.*'
    step cli 300 bash tests/gpu/test_dptrain_gpu.sh "$(command -v dptrain || echo dptrain)"
    step nccl 60 test_gpu_nccl
    step reducer2 90 "$MPIRUN" -np 2 test_gpu_nccl --gtest_filter='GpuReducer.*'
    # ResNet-50 (torchvision's layout, issue 32) at 224x224x3 on synthetic data, bf16 on the graph
    # API beside PyTorch tuned (1.04x on an H100 at 8440b46, before the 16-byte max-pool).
    syn=synthetic:224x224x3:2048:256
    step bench_resnet50_graph_act16_bf16 80 dptrain --device cuda --model resnet50 --recipe d2l --data "$syn" \
      --epochs 3 --progress off "${act16[@]}" --metrics "$logs/bench_resnet50_graph_act16_bf16.jsonl"
    step bench_resnet50_torch_bf16_tuned 80 "${torch_py[@]}" bench/torch_ref.py --recipe d2l --device cuda \
      --data "$syn" --model resnet50 --epochs 3 --config tuned --bf16 --json
    table
    # 64 timed candidates a key in bf16 (in TF32 and strict fp32 they gained nothing on an H100,
    # 2026-11-27); the debug log lists every candidate's time (why OIHW plans beat the OHWI ones).
    dptrain_run resnet18_graph_act16_plans64_bf16 40 3 graph,DPT_CUDNN_MAX_PLANS=64 "${act16[@]}" --log-level debug
    table
    # ResNet-50's step kernel by kernel, one step ($OUT/profile_resnet50.md): two steps under ncu
    # ran past 138 s on an H100 (2026-11-27; about 1.6 came back).
    profile profile_resnet50 150 5:6 --model resnet50 --epochs 1 --max-steps 6 --precision bf16 \
      --data "$syn"
    # Where ResNet-18's bf16 step goes, kernel by kernel: $OUT/profile.md, for the missed 0.8
    # s/epoch target.
    profile profile 100 20:22 --model resnet18 --epochs 1 --max-steps 22 --precision bf16 --data "$data"
    # Last: the fused convolution lost to the separate passes on an H200 and twice on an H100.
    # Without the ResNet-18 geometry sweep (a plan search per site, over 60 s on an H100):
    # fusedbench below builds and times the same sites.
    step fusedconv 120 test_fused_conv --gtest_filter='-FusedConv.ResNet18GeometriesBuildOrReportUnsupported'
    step fusedbench 90 gpu_conv_bench --fused --batch 256 --steps 10
    ;;
  perf)
    group P1 470  # issue 29's targets, the new path first; ResNet-18 3 epochs, LeNet 10
    # Beside each precision's default run, --cudnn-nondeterministic: PyTorch tuned lets cuDNN's
    # non-deterministic engines compete (cudnn.deterministic is off by default), dptrain does not
    # unless asked; a non-deterministic backward-filter algorithm was up to 1.4 ms faster than the
    # deterministic ones on one fp32 shape (cudnn_conv.cc). Strict fp32 is 0.69x, TF32 1.21x.
    dptrain_run resnet18_graph_act16_bf16 60 3 graph "${act16[@]}"
    pytorch resnet18 bf16 tuned 60
    dptrain_run resnet18_graph_tf32 60 3 graph --tf32
    pytorch resnet18 tf32 tuned 60
    dptrain_run resnet18_graph_nondet_tf32 60 3 graph --tf32 --cudnn-nondeterministic
    dptrain_run resnet18_graph 90 3 graph
    pytorch resnet18 fp32 tuned 90
    dptrain_run resnet18_graph_nondet 90 3 graph --cudnn-nondeterministic
    dptrain_run resnet18_graph_act16_nondet_bf16 60 3 graph "${act16[@]}" --cudnn-nondeterministic
    for prec in fp32 tf32 bf16; do
      f=()
      case $prec in tf32) f=(--tf32) ;; bf16) f=("${act16[@]}") ;; esac
      dptrain_run "lenet_graph_$prec" 40 10 graph ${f[@]+"${f[@]}"}
      pytorch lenet "$prec" tuned 40
    done
    table
    # The legacy API's controls, then accuracy after 10 epochs, bf16 against fp32 (target: within
    # 0.005; met within it on an H100 at 8440b46 by the means of the last three and five).
    dptrain_run resnet18_legacy_tf32 60 3 legacy --tf32
    dptrain_run resnet18_legacy 90 3 legacy
    dptrain_run resnet18_graph_act16_bf16_e10 90 10 graph "${act16[@]}"
    dptrain_run resnet18_graph_tf32_e10 90 10 graph --tf32
    for prec in bf16 tf32 fp32; do pytorch resnet18 "$prec" eager 60; done
    for prec in bf16 tf32 fp32; do pytorch lenet "$prec" eager 40; done
    ;;
  compile)  # torch.compile max-autotune: LeNet about 60 s a precision (50 s of it compiling, H200)
    group P 470
    for prec in bf16 tf32 fp32; do pytorch lenet "$prec" compile 100; done
    for prec in bf16 tf32 fp32; do pytorch resnet18 "$prec" compile 300; done
    ;;
esac
table
note "done: $(secs "$(now_ms)") s of $deadline"
pack
rm -rf "$logs"
