#!/usr/bin/env bash
# launch.sh: N processes of a program on this host, one per GPU, for a host without mpirun (README "Multi-GPU"):
#     scripts/launch.sh 2 ./train_klacu -b 16 -t 1024 -d 32768 ...
# Process r gets RANK=r, LOCAL_RANK=r, WORLD_SIZE=N and one TRAIN_KLA_LAUNCH_ID for the launch (ranks.h reads them),
# and its stdout and stderr are this script's. When one exits with an error the others are stopped (a rank left
# alone would wait for its peers forever), and the script exits with the first failure's code; 0 when all succeed.
set -u
if [ $# -lt 2 ] || ! [[ "$1" =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: scripts/launch.sh N program [arguments...]   (N >= 1 processes, one per GPU)" >&2
    exit 2
fi
n=$1
shift
export WORLD_SIZE=$n TRAIN_KLA_LAUNCH_ID="launch$$.$(date +%s%N)" NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
declare -A rank_of
for ((r = 0; r < n; r++)); do
    RANK=$r LOCAL_RANK=$r "$@" &
    rank_of[$!]=$r
done
code=0
while [ ${#rank_of[@]} -gt 0 ]; do
    wait -n -p finished "${!rank_of[@]}"
    rc=$?
    rank=${rank_of[$finished]}
    unset "rank_of[$finished]"
    if [ $rc -ne 0 ] && [ $code -eq 0 ]; then
        code=$rc
        echo "launch.sh: rank $rank exited with status $rc: stopping the other ranks" >&2
        for pid in "${!rank_of[@]}"; do kill -TERM "$pid" 2> /dev/null; done
    fi
done
exit $code
