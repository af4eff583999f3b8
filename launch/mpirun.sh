#!/usr/bin/env bash
# mpirun on one host with what these machines need: --allow-run-as-root only as root,
# --oversubscribe only when there are more ranks than cores, and the ob1 PML (MPI_Init in ~20 ms
# instead of ~225 ms probing UCX). Usage: launch/mpirun.sh -np N program [args...]
set -euo pipefail
np=1
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  [[ ${args[i]} == -np || ${args[i]} == -n ]] && np=${args[i+1]}
done
extra=()
[[ $(id -u) -eq 0 ]] && extra+=(--allow-run-as-root)
((np > $(nproc))) && extra+=(--oversubscribe)
# Ranks' stderr is a pipe under mpirun: tell them whether the user's terminal is there.
[[ -t 2 ]] && extra+=(-x DPT_PROGRESS=1)
export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1}
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader,tcp}
exec mpirun "${extra[@]}" --bind-to none "$@"
