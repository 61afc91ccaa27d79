#!/bin/bash
# main job, Ctrl-C as a terminal sends it (to the foreground process group) at step 2
cd /work/main
ls /dev/shm > /tmp/mj/shm_before.txt
setsid bash scripts/run_capo_smollm2_cpu.sh trainer.total_training_steps=20 trainer.save_freq=2 trainer.experiment_name=stop_test > /tmp/mj/run.log 2>&1 &
PID=$!
sleep 2
PGID=$(ps -o pgid= $PID | tr -d ' ')
echo "pid $PID pgid $PGID"
until grep -q "step:2 " /tmp/mj/run.log; do sleep 2; if ! kill -0 $PID 2>/dev/null; then echo ended early; exit 1; fi; done
date +%s.%N > /tmp/mj/t_sigint
kill -INT -$PGID
wait $PID; echo "rc=$?"
date +%s.%N > /tmp/mj/t_end
python3 -c "print('stop took', float(open('/tmp/mj/t_end').read())-float(open('/tmp/mj/t_sigint').read()))"
ls /dev/shm > /tmp/mj/shm_after.txt
diff /tmp/mj/shm_before.txt /tmp/mj/shm_after.txt && echo shm_clean
ps -eo pid,cmd | grep -E "ray::|raylet|gcs_server|vllm|main_ppo" | grep -v grep || echo no_processes_left
cat ~/checkpoints/capo_cpu/stop_test/latest_checkpointed_iteration.txt
