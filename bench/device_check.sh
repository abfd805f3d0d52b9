#!/usr/bin/env bash
# Every check the GPU box must show, in as few device calls as possible.
#   bash bench/device_check.sh [engine] [tasks] [collectors] [gpu] [judge] [soak] [gate] [noisefloor] [selfcheck] [holdout] [pkb]
#   bash bench/device_check.sh --code-hash   (the hash of the Python files a call prints as "code:")
#   (default: engine tasks collectors gpu judge)
#   judge: bench/judge_gpu_check.py (runner path, adversarial suite, spin-kernel timing check, GPU faults, batching check,
#   self-check of every task); JUDGE_PARTS picks its parts (default all), ADV_CONFIGS the adversarial
#   suite's modes (default nccl:1,shared-gpu:2), ADV_ATTACKS a subset of its attacks; SPIN_TIMEOUT the spin
#   runs' --timeout (default 300; 45 gives each a 13.5 s timing budget, too short for the 5 ms spin) and
#   SPIN_CALL_S the spin batch's limit (default 500 s; cut off there, the runs it finished are still read
#   from their event files); SPIN_TARGETS the spins (us, default 5,50,500,5000; the 0-spin base always
#   runs), SPIN_CLONE=0 leaves out the clone-only item and SPIN_SIDE=0 the side-stream item (a 500 us spin
#   on a stream nothing waits for: the eager figure must hold it).
#   soak: bench/soak.py on this box's GPU (SOAK_MINUTES, default 3; SOAK_TIMEOUT per run, default 25 s: a hanging
#   candidate costs that much each), its database copied to $OUT.
#   gate: the GPU gate (engine.gate, PKB_GPU_GATE=1): judge_gpu_check's gate part (fixtures), then
#   one task and model (GATE_TASK, default dp_int8_allreduce, whose baseline hung in a gated block on the
#   H100 before graphs were uploaded first; GATE_MODEL, default baseline) with every step traced
#   (PKB_GATE_TRACE=1: its log lines, and the stacks of a block still going 3 s on), then the
#   self-check of every task (GATE_SELFCHECK_TASKS, default all) with the gate (PKB_GPU_GATE=1, its
#   database kept as $OUT/gate_selfcheck.db).
#   selfcheck: issue 11's self-check as a user would run it: `pkb-tui calibrate --noise-only` (the host's
#   floor over every task, folded into every later interval; ~6-7 min on the H100), then every task
#   (SELFCHECK_TASKS) baseline against itself on that database, graph basis (SELFCHECK_BASIS), counted by
#   bench/selfcheck_count.py (NOISE_TASKS: calibrate's --noise-tasks, default all). Split in two calls when one is too short: `noisefloor` runs the calibrate
#   alone (its database $OUT/selfcheck.db); `selfcheck` with SELFCHECK_FROM=<that database, carried back>
#   skips the calibrate and times on a copy of it (the same host: the floor is kept per host).
#   CALL_S=<the call's limit> gives the self-check what the calibrate left; SELFCHECK_TASKS=rest (with
#   SELFCHECK_FROM) times only the tasks that database has no self-check of, and the count is per task.
#   holdout: self-checks of every task (HOLDOUT_S each, default 270 s; ~185 s on the H200) on one database
#   with no floor, then bench/selfcheck_holdout.py: each task's figure per batch, and the floor from each
#   batch (as calibrate takes it) applied to the others. HOLDOUT_BATCHES: the batches, ';' apart, each
#   "plain", "reverse" (tasks in reverse order) and/or VAR=value words (its environment), e.g.
#   "plain;reverse;PKB_BASELINE_TRIALS=1;PKB_SANDBOX_READS=0 PKB_SANDBOX_NET=0" (default "plain;plain").
#   HOLDOUT_FROM=<a holdout.db carried back>: its batches are counted with this call's (split over calls).
#   CALL_S=<the call's limit>: each batch gets at most an even share of what is left of it.
#   pkb: bench/pkb_compare.sh on the PKB clone at $PKB_CLONE (default .pkb), problems $PKB_RANGE (default 1-8);
#   RUN_LOCAL_FROM/RUN_LOCAL_MAX/PKB_TUI_SKIP as that script reads them.
# Writes JSON and logs under $OUT (the device tool brings $OUT back) and prints short tables.
# selfcheck and holdout also keep each item's time per phase (the judges' "item's time" lines) in
# $OUT/phases.txt and print the five slowest items' rounds.
set -u
code_hash() {  # the project's Python files (names and contents), the same on this machine and the device
  find pkb_tui tasks collectors bench -name '*.py' -not -path '*/__pycache__/*' | LC_ALL=C sort | xargs sha1sum | sha1sum | cut -c1-12
}
[ "${1:-}" = --code-hash ] && { code_hash; exit 0; }
OUT=${OUT:-/tmp/pkb-out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# Never let anything switch NVLink multicast on.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# Issue 11's self-check: the baseline against itself at size small, one GPU (gate, selfcheck, holdout).
SELFCHECK_ARGS=(--model baseline --world-size 1 --mode nccl --size small --trials 1 --iterations 1 --no-profile --timeout 25)
PY=${PY:-python3}
DB="$OUT/runs.db"
COLLECTIVES=all_reduce,all_gather,reduce_scatter,all_to_all,broadcast,reduce,gather,scatter
sections=${*:-engine tasks collectors gpu judge}

BUDGET_S=${BUDGET_S:-100000}  # start nothing new past this many seconds (device time is scarce)
over_budget() { [ "$SECONDS" -ge "$BUDGET_S" ] && echo "--- skipped $1: past the ${BUDGET_S} s budget"; }

run() {  # run NAME ARGS...: pkb-tui run --json into $OUT/NAME.json, log to $OUT/NAME.err
  local name=$1; shift
  over_budget "$name" && return
  local t0=$SECONDS
  timeout ${RUN_TIMEOUT:-150} $PY -m pkb_tui.cli --db "$DB" run "$@" --json >"$OUT/$name.json" 2>"$OUT/$name.err"
  echo "--- $name: exit $? in $((SECONDS - t0)) s"
  tail -3 "$OUT/$name.err" | grep -v '^finished' || true
}

phases() {  # where each item's time went (the judges' lines in the run logs, which are not kept) into $OUT/phases.txt
  grep -rh "item's time" "$OUT/pkb-runs" 2>/dev/null >>"$OUT/phases.txt"
  echo "item phases: $(grep -c . "$OUT/phases.txt" 2>/dev/null || echo 0) lines in phases.txt; the slowest rounds:"
  grep -o "^rank 0: [a-z0-9_]* .*[0-9]* timing rounds\? [0-9.]* s" "$OUT/phases.txt" 2>/dev/null \
    | awk '{print $NF=="s" ? $(NF-1) : $NF, $0}' | sort -rn | head -5 | cut -d' ' -f2-
}

echo "=== host"
# The code this call runs (the device's copy of .git can lag the tree it runs): compare with
# `bash bench/device_check.sh --code-hash` here.
echo "code: $(code_hash)"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
$PY -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
GPUS=$($PY -c "import torch; print(torch.cuda.device_count())")

for section in $sections; do
  over_budget "$section" && continue
  case $section in
  engine)
    echo "=== engine: the eight collectives, baseline and torch-p2p"
    run nccl_ws1 --task $COLLECTIVES --model baseline,torch-p2p --world-size 1 --mode nccl --size default --trials 3
    if [ "$GPUS" -gt 1 ]; then
      run nccl_wsN --task $COLLECTIVES --model baseline,torch-p2p --world-size "$GPUS" --mode nccl --size default --trials 3
    fi
    run shared_ws2 --task $COLLECTIVES --model baseline,torch-p2p --world-size 2 --mode shared-gpu --size small --trials 3 --iterations 20
    run shared_ws4 --task $COLLECTIVES --model baseline,torch-p2p --world-size 4 --mode shared-gpu --size small --trials 3 --iterations 20
    $PY bench/summarize_runs.py "$OUT"/nccl_ws*.json "$OUT"/shared_ws*.json
    ;;
  tasks)
    echo "=== tasks: every task's baseline"
    run tasks_nccl_ws1 --task all --model baseline --world-size 1 --mode nccl --size default --trials 2 --iterations 20 --no-profile
    run tasks_shared_ws2 --task all --model baseline --world-size 2 --mode shared-gpu --size small --trials 2 --iterations 10 --no-profile
    $PY bench/summarize_runs.py "$OUT"/tasks_*.json
    ;;
  collectors)
    echo "=== collectors"
    timeout 110 $PY bench/gpu_collectors_check.py 2>&1 | tee "$OUT/collectors_check.txt" | tail -60
    timeout 80 $PY bench/collector_overhead.py 2>&1 | tee "$OUT/collector_overhead.txt" | tail -20
    timeout 60 $PY -m pkb_tui.cli --db "$DB" monitor --duration 2 --interval 0.5 --json --no-record 2>&1 | tail -3
    ;;
  gpu)
    echo "=== custom-kernel path (bench/gpu_check.py)"
    timeout 400 $PY bench/gpu_check.py --db "$DB" 2>&1 | tee "$OUT/gpu_check.txt" | tail -60
    ;;
  judge)
    echo "=== judge (bench/judge_gpu_check.py)"
    timeout 1500 $PY bench/judge_gpu_check.py --out "$OUT" --parts "${JUDGE_PARTS:-smoke,adversarial,spin,faults,batching,selfcheck}" \
      --adversarial-configs "${ADV_CONFIGS:-nccl:1,shared-gpu:2}" 2>&1 \
      | tee "$OUT/judge_check.txt" | tail -90
    # the escaped helper's and its runner's awake seconds (fixture containment/escaped-worker): the
    # last line of each candidate log; stopped together, the two agree (the CPU test: within 25%)
    grep -rh "^AWAKE " "$OUT/pkb-runs" 2>/dev/null | tail -4
    tar czf "$OUT/judge_logs.tgz" -C "$OUT" pkb-runs 2>/dev/null && rm -rf "$OUT/pkb-runs"
    ;;
  soak)
    echo "=== soak (bench/soak.py, ${SOAK_MINUTES:-3} min)"
    timeout $(( ${SOAK_MINUTES:-3} * 60 + 120 )) $PY bench/soak.py --mode nccl --world-size 1 --runs 1000 --timeout "${SOAK_TIMEOUT:-25}" \
      --max-minutes "${SOAK_MINUTES:-3}" --workdir /tmp/pkb-soak 2>&1 | tee "$OUT/soak.txt" | tail -40
    cp /tmp/pkb-soak/runs.db "$OUT/soak_runs.db" 2>/dev/null
    ;;
  gate)
    echo "=== the GPU gate: fixtures"
    timeout 200 $PY bench/judge_gpu_check.py --out "$OUT" --parts gate 2>&1 | tail -12
    echo "=== the GPU gate: ${GATE_TASK:-dp_int8_allreduce}, traced"
    PKB_GPU_GATE=1 PKB_GATE_TRACE=1 timeout 120 $PY -m pkb_tui.cli --db "$OUT/gate_trace.db" run --task "${GATE_TASK:-dp_int8_allreduce}" \
      --model "${GATE_MODEL:-baseline}" --world-size 1 --mode nccl --size small --trials 1 --no-profile --timeout 40 \
      --speedup-basis graph --json >"$OUT/gate_trace.json" 2>"$OUT/gate_trace.err"
    echo "exit $?"; grep -h "pkb gate" -r "$OUT/pkb-runs" "$OUT/gate_trace.err" | sort -k3 -n | tail -40
    echo "--- stacks of a gated block still going 3 s on (gate.watch)"
    grep -rh -A16 "^Timeout (" "$OUT/pkb-runs" "$OUT/gate_trace.err" | grep -v "^  File .*/\(threading\|selectors\)\.py" | head -90
    tar czf "$OUT/gate_trace_logs.tgz" -C "$OUT" pkb-runs 2>/dev/null && rm -rf "$OUT/pkb-runs"
    echo "=== the GPU gate: self-check of every task"
    PKB_GPU_GATE=1 timeout "${GATE_SELFCHECK_S:-450}" $PY -m pkb_tui.cli --db "$OUT/gate_selfcheck.db" run --task "${GATE_SELFCHECK_TASKS:-all}" \
      "${SELFCHECK_ARGS[@]}" --speedup-basis graph --json >"$OUT/gate_selfcheck.json" 2>"$OUT/gate_selfcheck.err"
    echo "exit $?"; $PY bench/summarize_runs.py "$OUT/gate_selfcheck.json" 2>&1 | tail -40
    rm -rf "$OUT/pkb-runs"
    ;;
  noisefloor|selfcheck)
    if [ "$section" = selfcheck ] && [ -n "${SELFCHECK_FROM:-}" ]; then
      echo "=== every task's baseline against itself on a copy of $SELFCHECK_FROM (its noise floor)"
      cp "$SELFCHECK_FROM" "$OUT/selfcheck.db" && chmod u+w "$OUT/selfcheck.db" || exit 1  # carried back: read-only
      $PY -m pkb_tui.cli --db "$OUT/selfcheck.db" query --json \
        "SELECT h.gpu_model, c.mode, c.noise_floor_fraction, json_extract(c.detail, '\$.graph_noise_floor_fraction') AS graph
         FROM calibrations c JOIN hosts h ON h.id = c.host_id WHERE c.kind = 'noise_floor'"
    else
      echo "=== the noise floor (calibrate --noise-only, every task)"
      timeout "${NOISEFLOOR_S:-560}" $PY -m pkb_tui.cli --db "$OUT/selfcheck.db" calibrate --noise-only \
        --noise-tasks "${NOISE_TASKS:-all}" --json \
        >"$OUT/calibrate.json" 2>"$OUT/calibrate.err"
      echo "exit $?"; tail -5 "$OUT/calibrate.err"
      $PY bench/selfcheck_count.py --calibration "$OUT/calibrate.json" | tail -45
      [ "$section" = noisefloor ] && { rm -rf "$OUT/pkb-runs"; continue; }
      echo "=== every task's baseline against itself on that database"
    fi
    tasks=${SELFCHECK_TASKS:-all}
    if [ "$tasks" = rest ]; then  # the tasks this database has no finished self-check of yet
      $PY -m pkb_tui.cli --db "$OUT/selfcheck.db" runs --model baseline --limit 1000 --json >"$OUT/selfcheck_runs.json"
      tasks=$($PY bench/selfcheck_count.py --rest "$OUT/selfcheck_runs.json")
      echo "the rest: $tasks"
    fi
    if [ "$tasks" != none ]; then
      limit=${SELFCHECK_S:-450}
      # CALL_S: the device call's whole limit; the self-check gets what the calibrate left (then `rest` in the next call)
      [ -n "${CALL_S:-}" ] && limit=$(( CALL_S - SECONDS - 20 ))
      echo "self-check limit: $limit s"
      timeout "$limit" $PY -m pkb_tui.cli --db "$OUT/selfcheck.db" run --task "$tasks" "${SELFCHECK_ARGS[@]}" \
        --speedup-basis "${SELFCHECK_BASIS:-graph}" --json >"$OUT/selfcheck.json" 2>"$OUT/selfcheck.err"
      echo "exit $?"
    fi
    # counted from the database: a self-check cut short, or split over calls, counts what finished; in the
    # self-check's basis (`runs` shows eager unless told: on 2026-12-07 the "basis" counts were eager ones)
    $PY -m pkb_tui.cli --db "$OUT/selfcheck.db" runs --model baseline --limit 1000 --speedup-basis "${SELFCHECK_BASIS:-graph}" --json >"$OUT/selfcheck_runs.json"
    $PY bench/selfcheck_count.py "$OUT/selfcheck_runs.json" | tail -40
    phases
    rm -rf "$OUT/pkb-runs"
    ;;
  holdout)
    echo "=== self-checks of every task on one database, no floor stored: the floor from each applied to the others"
    # HOLDOUT_FROM=<a holdout.db carried back>: its batches count too (a holdout split over calls;
    # on another machine than the first call's, say so: the floor is a host's)
    if [ -n "${HOLDOUT_FROM:-}" ]; then cp "$HOLDOUT_FROM" "$OUT/holdout.db" && chmod u+w "$OUT/holdout.db" || exit 1; fi
    all_ids=${SELFCHECK_TASKS:+$(echo "$SELFCHECK_TASKS" | tr ',' ' ')}
    [ -n "$all_ids" ] || all_ids=$($PY -c "from tasks.base import all_tasks; print(' '.join(all_tasks()))")
    i=0
    IFS=';' read -ra specs <<<"${HOLDOUT_BATCHES:-plain;plain}"
    for spec in "${specs[@]}"; do  # words: "reverse" (the tasks in reverse order), VAR=value (the batch's environment)
      i=$((i + 1)); order=$all_ids; envs=()
      for word in $spec; do
        case "$word" in reverse) order=$(echo "$all_ids" | tr ' ' '\n' | tac | tr '\n' ' ');; *=*) envs+=("$word");; esac
      done
      tasks=$(echo $order | tr ' ' ',')
      limit=${HOLDOUT_S:-270}
      # CALL_S: the device call's whole limit, shared evenly by the batches still to run (the analysis after: 30 s)
      if [ -n "${CALL_S:-}" ]; then
        share=$(( (CALL_S - SECONDS - 30) / (${#specs[@]} - i + 1) ))
        [ "$share" -lt "$limit" ] && limit=$share
      fi
      [ "$limit" -ge 30 ] || { echo "batch $i ($spec): skipped, $limit s of the call left for it"; continue; }
      env "${envs[@]}" timeout "$limit" $PY -m pkb_tui.cli --db "$OUT/holdout.db" run --task "$tasks" \
        "${SELFCHECK_ARGS[@]}" --speedup-basis graph --json >"$OUT/holdout$i.json" 2>"$OUT/holdout$i.err"
      echo "batch $i ($spec): exit $? at $SECONDS s (limit $limit s)"
    done
    $PY -m pkb_tui.cli --db "$OUT/holdout.db" runs --model baseline --limit 1000 --json >"$OUT/holdout_runs.json"
    $PY bench/selfcheck_holdout.py "$OUT/holdout_runs.json"
    phases
    rm -rf "$OUT/pkb-runs"
    ;;
  pkb)
    echo "=== ParallelKernelBench against run_local.py (bench/pkb_compare.sh)"
    OUT="$OUT" bash bench/pkb_compare.sh "${PKB_CLONE:-.pkb}" "${PKB_RANGE:-1-8}" 2>&1 | tail -30
    rm -rf "$OUT/pkb_reference_as_triton" "$OUT/pkb_logs"
    ;;
  esac
done
