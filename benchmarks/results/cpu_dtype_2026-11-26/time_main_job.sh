#!/usr/bin/env bash
# usage: time_main_job.sh LABEL OUTDIR [env assignments...]  (run from the worktree, under flock)
set -u
label=$1; out=$2; shift 2
mkdir -p "$out"
log="$out/console_$label.log"
ckpt=$(mktemp -d /tmp/i34ckpt.XXXX)
{
echo "## $label"
echo "date_start $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) env: $*"
echo "loadavg_before $(cat /proc/loadavg)"
echo "shm_before $(ls /dev/shm | tr '\n' ' ')"
} >> "$out/runs.txt"
( while sleep 15; do echo "$(date -u +%T) $(cat /proc/loadavg)"; done ) > "$out/load_$label.txt" &
lp=$!
t0=$(date +%s)
env "$@" CAPO_CPU_CKPT_DIR="$ckpt" bash scripts/run_capo_smollm2_cpu.sh > "$log" 2>&1
rc=$?
t1=$(date +%s)
kill $lp
sleep 5
{
echo "exit $rc wall $((t1-t0)) s"
echo "loadavg_after $(cat /proc/loadavg)"
echo "shm_after $(ls /dev/shm | tr '\n' ' ')"
echo "timing_s/gen: $(grep -o "'timing_s/gen': [0-9.]*\|timing_s/gen:[0-9.]*" "$log" | grep -o '[0-9.]*$' | tr '\n' ' ')"
echo "timing_s/update_actor: $(grep -o "timing_s/update_actor:[0-9.]*" "$log" | grep -o '[0-9.]*$' | tr '\n' ' ')"
echo "timing_s/step: $(grep -o "timing_s/step:[0-9.]*" "$log" | grep -o '[0-9.]*$' | tr '\n' ' ')"
echo "dtype_line: $(grep -m1 'compute dtype' "$log")"
echo
} >> "$out/runs.txt"
rm -rf "$ckpt"
