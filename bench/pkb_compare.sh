#!/usr/bin/env bash
# ParallelKernelBench problems 1-8 on one GPU (nccl, world size 1): pkb-tui against PKB's own
# run_local.py, the reference as the candidate in both, 5 trials each, and the wall-time ratio.
#   bash bench/pkb_compare.sh /path/to/ParallelKernelBench [problems, default 1-8]
# Writes JSON and logs under $OUT and prints a table. Needs a GPU; the lead runs it on the H200.
#
# The candidate: PKB's run_local.py --mode eval refuses --solution reference, so both tools run
# copies of the reference files named <stem>_triton.py (the triton backend's init does nothing a
# torch-only file needs) from one folder: pkb-tui with --backend triton, run_local.py with
# --solution triton --solutions-dir. Both check 5 trials and time with their own defaults
# (pkb-tui: its warm-up and timed blocks; run_local.py: --measure-perf, 500 warm-up + 100 timed).
set -u
CLONE=${1:?usage: bench/pkb_compare.sh PKB_CLONE [FIRST-LAST]}
RANGE=${2:-1-8}
CLONE=$(cd "$CLONE" && pwd)
OUT=${OUT:-/tmp/pkb-out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PY:-python3}
TRIALS=${TRIALS:-5}
MODE=${MODE:-nccl}; SIZE=${SIZE:-default}  # MODE=cpu SIZE=small: a dry run of this script on a CPU box
FIRST=${RANGE%-*}; LAST=${RANGE#*-}

CAND="$OUT/pkb_reference_as_triton"
rm -rf "$CAND"; mkdir -p "$CAND"
STEMS=()
for f in "$CLONE"/reference/*.py; do
  stem=$(basename "$f" .py); n=${stem%%_*}
  case $n in ''|*[!0-9]*) continue;; esac
  if [ "$n" -ge "$FIRST" ] && [ "$n" -le "$LAST" ]; then cp "$f" "$CAND/${stem}_triton.py"; STEMS+=("$stem"); fi
done
echo "=== problems: ${STEMS[*]}"

if [ "${PKB_TUI_SKIP:-0}" = 1 ]; then  # a second device call: run_local.py on the problems the first had no time for
  echo "=== pkb-tui: skipped (PKB_TUI_SKIP=1)"; PKB_TUI_S=0
else
echo "=== pkb-tui: one launch, ${#STEMS[@]} problems x $TRIALS trials, $MODE ws 1, size $SIZE (default: 1024x1024 bf16)"
t0=$SECONDS
timeout ${PKB_TUI_TIMEOUT:-1800} $PY -m pkb_tui.cli --db "$OUT/pkb_runs.db" run --pkb-root "$CLONE" --task "pkb/$RANGE" \
  --model "$CAND" --backend triton --world-size 1 --mode "$MODE" --size "$SIZE" --trials "$TRIALS" ${PKB_TUI_ARGS:-} --json \
  >"$OUT/pkb_tui.json" 2>"$OUT/pkb_tui.err"
rc=$?
PKB_TUI_S=$((SECONDS - t0))
echo "--- pkb-tui: exit $rc in ${PKB_TUI_S} s"
tail -3 "$OUT/pkb_tui.err"
$PY - "$OUT/pkb_tui.json" <<'PYEOF'
import json, sys
doc = json.load(open(sys.argv[1]))
for r in doc["runs"]:
    b, c = r.get("baseline") or {}, r.get("candidate") or {}
    print(f"{r['task']:<28} {r['status']:<8} trials {c.get('trials_passed')}/{c.get('trials_total')} "
          f"baseline {b.get('median_us')} us candidate {c.get('median_us')} us traffic {(b.get('traffic') or {}).get('send_bytes')}")
for s in doc.get("skipped", []):
    print("skipped:", s)
PYEOF
fi

echo "=== PKB run_local.py: one eval per problem, $TRIALS trials, --measure-perf, 1 GPU"
PKB_TOTAL=0
RUN_LOCAL_MAX=${RUN_LOCAL_MAX:-${#STEMS[@]}}  # device time is scarce: run_local.py on K problems only,
RUN_LOCAL_FROM=${RUN_LOCAL_FROM:-0}            # from the J-th (0-based): two device calls can share the 8
DONE=0
for stem in "${STEMS[@]:$RUN_LOCAL_FROM:$RUN_LOCAL_MAX}"; do
  t0=$SECONDS
  (cd "$CLONE" && timeout ${PKB_TIMEOUT:-900} $PY run_local.py --nproc-per-node 1 --mode eval --problem "$stem" \
     --solution triton --solutions-dir "$CAND" --trials "$TRIALS" --measure-perf --logs-dir "$OUT/pkb_logs" \
     >"$OUT/run_local_${stem}.log" 2>&1)
  rc=$?
  s=$((SECONDS - t0)); PKB_TOTAL=$((PKB_TOTAL + s)); DONE=$((DONE + 1))
  echo "{\"problem\": \"$stem\", \"run_local_s\": $s, \"exit\": $rc}" >>"$OUT/run_local_times.jsonl"
  echo "--- run_local $stem: exit $rc in $s s ($(grep -E 'all trials match|mismatch' "$OUT/run_local_${stem}.log" | tail -1))"
done
if [ "$DONE" -eq "${#STEMS[@]}" ]; then
  echo "=== wall time: pkb-tui ${PKB_TUI_S} s for all, run_local.py ${PKB_TOTAL} s; run_local / pkb-tui = $($PY -c "print(round($PKB_TOTAL / max(1, $PKB_TUI_S), 2))")"
else  # a projection, labelled as one: run_local.py's mean per problem over the ones it ran
  echo "=== wall time: pkb-tui ${PKB_TUI_S} s for ${#STEMS[@]} problems; run_local.py ${PKB_TOTAL} s for the first $DONE" \
       "($($PY -c "print(round($PKB_TOTAL / max(1, $DONE), 1))") s each); projected for ${#STEMS[@]}:" \
       "$($PY -c "print(round($PKB_TOTAL / max(1, $DONE) * ${#STEMS[@]} / max(1, $PKB_TUI_S), 2))")x pkb-tui's (projection, not measured)"
fi
echo "{\"problems\": \"$RANGE\", \"trials\": $TRIALS, \"pkb_tui_s\": $PKB_TUI_S, \"run_local_s\": $PKB_TOTAL, \"run_local_problems\": $DONE}" >"$OUT/pkb_compare.json"
