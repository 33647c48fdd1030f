#!/usr/bin/env bash
# One GPU session's measurements in one go: every speed row against the three PyTorch sides
# (loop, vmap, vmap + torch.compile), the per-op profile of DS-FL's paper round, and the peak
# device memory of each fedjax_kd round (gpu_suite's rows: peak_device_bytes), each part under
# its own time limit, everything written to one folder (default $OUT, else runs/gpu_session)
# and packed as gpu_session.tar.gz there.
#
#   bash benchmarks/gpu_session.sh [OUT_DIR [PART ...]]   # all default parts: about 7 minutes
#   TINY=1 bash benchmarks/gpu_session.sh /tmp/gs dsfl    # a CPU smoke run of the script
#
# Parts: env dsfl blazefl profile_dsfl resnet20 (the default), memory (the memory planner's
# estimates against measured peaks, benchmarks/performance/memory_plan.py; 70 s) and memory_resnet20
# (SCARLET's ResNet-20 round at K = 100, scarlet_cifar10 on stand-in data, planned for a 24 GiB
# device, FEDJAX_KD_DEVICE_MEMORY=24GiB: the clients at once the planner chooses, its figure,
# XLA's, and two rounds' peak device memory (goal: at most 20 GiB) and time per round; about
# 5 minutes) and remat (benchmarks/performance/remat.py: does recomputing ResNet-20's blocks give memory
# back on this device, and at what time; XLA:CPU gives none; 2 minutes), e.g. a second call `bash benchmarks/gpu_session.sh "$OUT" memory memory_resnet20`. A part that runs out of time leaves its log
# (the finished runs are in it: `python benchmarks/performance/gpu_suite.py --from_logs=...` rebuilds their
# rows). The device machines have jax, flax, optax, chex, orbax and torch, but not
# ml_collections: carry its wheel (pip download --no-deps ml_collections into an ignored
# folder and install it there first) before running this script.
set -u
cd "$(dirname "$0")/.."
out="${1:-${OUT:-runs/gpu_session}}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 FEDJAX_KD_MNIST="${FEDJAX_KD_MNIST:-}"
py="${PYTHON:-python3}"

part() {   # part NAME SECONDS COMMAND...: one measurement, its log and exit status kept
  local name=$1 limit=$2
  shift 2
  echo "=== $name (limit ${limit}s): $*" | tee -a "$out/session.log"
  local t0=$SECONDS
  timeout --signal=INT --kill-after=20 "$limit" "$@" >"$out/$name.log" 2>&1
  local code=$?
  echo "=== $name: exit $code after $((SECONDS - t0)) s" | tee -a "$out/session.log"
  tail -n 8 "$out/$name.log" | tee -a "$out/session.log"
}

k=100   # clients of the profiled round (2 with TINY)
[ -n "${TINY:-}" ] && k=2
parts="${*:2}"
parts="${parts:-env dsfl blazefl profile_dsfl resnet20}"
for p in $parts; do
  case $p in
    env) part env 20 bash -c "nvidia-smi; $py -c 'import jax, torch; print(jax.__version__, \
jax.devices(), torch.__version__, torch.cuda.get_device_name())'" ;;
    # The headline rows: DS-FL K = 100 first (the target), then BlazeFL, then ResNet-20.
    dsfl) part dsfl 150 "$py" benchmarks/performance/gpu_suite.py ${TINY:+--tiny} --workload=dsfl --repeats=2 --rounds=3 \
      --torch_sides=loop,vmap,vmap_compiled --out="$out/dsfl.json" ;;
    blazefl) part blazefl 90 "$py" benchmarks/performance/gpu_suite.py ${TINY:+--tiny} --workload=blazefl --repeats=2 \
      --rounds=3 --torch_sides=vmap,vmap_compiled,loop --out="$out/blazefl.json" ;;
    profile_dsfl) part profile_dsfl 40 "$py" benchmarks/performance/profile_round.py --workload=dsfl \
      --clients=$k --top=15 --out="$out/profile_dsfl.json" ;;
    resnet20) part resnet20 120 "$py" benchmarks/performance/gpu_suite.py ${TINY:+--tiny} --workload=resnet20 --repeats=1 \
      --rounds=1 --torch_sides=vmap_compiled,vmap --out="$out/resnet20.json" ;;
    memory) part memory 70 "$py" benchmarks/performance/memory_plan.py --sizes=medium,large \
      --out="$out/memory.json" ;;
    memory_resnet20) part memory_resnet20 420 env FEDJAX_KD_DEVICE_MEMORY=24GiB "$py" \
      benchmarks/performance/memory_plan.py --configs=scarlet_cifar10 --measure \
      --out="$out/memory_resnet20.json" ;;
    remat) part remat 150 "$py" benchmarks/performance/remat.py --clients=$((k < 34 ? k : 34)) --repeats=5 \
      --out="$out/remat.json" ;;
    *) echo "error: unknown part '$p' (env dsfl blazefl profile_dsfl resnet20 memory memory_resnet20 remat)" >&2
       exit 2 ;;
  esac
done
tar -czf "$out/gpu_session.tar.gz" -C "$out" --exclude=gpu_session.tar.gz .
echo "packed: $out/gpu_session.tar.gz"
