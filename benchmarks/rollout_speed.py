"""Response tokens per second of the ``hf`` rollout inside verl's trainer against plain transformers ``generate``.

One run measures both, on the same model, dtype, prompts and batch:

1. **rollout**: ``python -m verl.trainer.main_ppo`` (CPU profile, ``hf`` rollout, v1 trainer, agent loop, reward,
   ``data.shuffle=false``) for ``--steps`` steps of ``--prompts`` prompts x ``--n`` samples. Per step, tokens/s =
   ``response_length/mean`` x batch / ``timing_s/gen`` (verl's generation phase: agent loop, tokenization,
   the server's decoding, reward), over steps 2..N (step 1 is a warm-up).
2. **plain generate**: ``model.generate(do_sample=True, temperature=1, max_new_tokens=<response length>)`` in this
   process on the same steps' prompts (chat template, each repeated ``n`` times, left-padded, one batch per
   step), counting each row's tokens up to and including its EOS.

It prints both and the ratio rollout / generate (goal: >= 0.7).

    python benchmarks/rollout_speed.py                      # SmolLM2-135M-Instruct, 4 prompts x 4, 48 tokens
    python benchmarks/rollout_speed.py --model tiny --steps 3
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

import psutil

REPO = Path(__file__).resolve().parents[1]


def verl_rollout(workdir: Path, model: Path, train: Path, val: Path, args) -> list[dict]:
    metrics_file = workdir / "metrics.jsonl"
    batch = args.prompts * args.n
    cmd = [
        sys.executable, "-m", "verl.trainer.main_ppo",
        f"--config-path={REPO / 'configs'}", "--config-name=cpu_base", "hydra.searchpath=[pkg://verl.trainer.config]",
        f"actor_rollout_ref.model.path={model}", f"data.train_files={train}", f"data.val_files={val}",
        "data.shuffle=false", f"data.train_batch_size={args.prompts}", "data.max_prompt_length=96",
        f"data.max_response_length={args.response_length}", f"actor_rollout_ref.rollout.n={args.n}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={batch}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={batch}",
        "actor_rollout_ref.rollout.temperature=1.0", "actor_rollout_ref.actor.optim.lr=1e-6",
        "algorithm.adv_estimator=grpo", "algorithm.norm_adv_by_std_in_grpo=false",
        "reward.custom_reward_function.path=pkg://capo_verl.reward", "reward.custom_reward_function.name=compute_score",
        f"trainer.total_training_steps={args.steps}", "trainer.val_before_train=false", "trainer.test_freq=-1",
        "trainer.save_freq=-1", "trainer.resume_mode=disable", "trainer.logger=[console,file]",
        "trainer.project_name=capo_rollout_speed", "trainer.experiment_name=rollout",
        f"trainer.default_local_dir={workdir / 'ckpt'}",
    ]
    env = dict(os.environ, VERL_FILE_LOGGER_PATH=str(metrics_file), RAY_DEDUP_LOGS="0", TOKENIZERS_PARALLELISM="false")
    env.setdefault("OMP_NUM_THREADS", str(len(os.sched_getaffinity(0))))
    env.setdefault("TQ_NUM_THREADS", str(min(8, psutil.cpu_count(logical=False) or 1)))
    with open(workdir / "console.log", "w") as log:
        proc = subprocess.run(cmd, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"verl exited with {proc.returncode}; see {workdir / 'console.log'}")
    steps: dict[int, dict] = {}
    for line in metrics_file.read_text().splitlines():
        record = json.loads(line)
        steps.setdefault(int(record["step"]), {}).update(record["data"])
    return [steps[s] for s in sorted(steps)]


def plain_generate(model_path: Path, train: Path, args) -> list[tuple[int, float]]:
    """(tokens, seconds) per step for the same prompts, with transformers' generate."""
    import pandas as pd
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    tok = AutoTokenizer.from_pretrained(model_path)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16).eval()
    eos = tok.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    rows = pd.read_parquet(train)["prompt"].tolist()
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    out = []
    for step in range(args.steps):
        prompts = rows[step * args.prompts : (step + 1) * args.prompts]
        ids = [tok.apply_chat_template(list(p), add_generation_prompt=True, tokenize=True) for p in prompts]
        ids = [list(x["input_ids"]) if isinstance(x, dict) or hasattr(x, "keys") else list(x) for x in ids]
        ids = [x for x in ids for _ in range(args.n)]
        enc = tok.pad({"input_ids": ids}, return_tensors="pt")
        t0 = time.time()
        with torch.inference_mode():
            seqs = model.generate(**enc, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                                  max_new_tokens=args.response_length, pad_token_id=pad, eos_token_id=eos)
        seconds = time.time() - t0
        resp = seqs[:, enc["input_ids"].shape[1]:]
        tokens = 0
        for row in resp.tolist():
            n = len(row)
            if eos in row:
                n = row.index(eos) + 1
            tokens += n
        out.append((tokens, seconds))
    del gen
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    parser.add_argument("--steps", type=int, default=5, help="steps; the first is a warm-up for both")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--response-length", type=int, default=48)
    parser.add_argument("--timeout", type=int, default=1200)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be >= 2")

    from capo_verl.models import smollm2_checkpoint, tiny_model_checkpoint, write_gsm8k_calc_parquet

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="capo_rollout_speed_"))
    workdir.mkdir(parents=True, exist_ok=True)
    model = smollm2_checkpoint() if args.model == "smollm2" else tiny_model_checkpoint(workdir / "tiny", seed=0)
    train, val = write_gsm8k_calc_parquet(workdir / "data", n_train=args.steps * args.prompts, n_val=4, seed=0)

    print(f"[rollout_speed] verl trainer, {args.steps} steps of {args.prompts} x {args.n} ...", flush=True)
    steps = verl_rollout(workdir, model, train, val, args)
    batch = args.prompts * args.n
    measured = steps[1:]
    r_tokens = sum(s["response_length/mean"] * batch for s in measured)
    r_seconds = sum(s["timing_s/gen"] for s in measured)
    print("[rollout_speed] plain generate on the same prompts ...", flush=True)
    plain = plain_generate(model, train, args)[1:]
    g_tokens = sum(t for t, _ in plain)
    g_seconds = sum(s for _, s in plain)

    rollout_tps, generate_tps = r_tokens / r_seconds, g_tokens / g_seconds
    print(f"\n{args.model}, {args.prompts} prompts x {args.n} samples = {batch} sequences, up to "
          f"{args.response_length} tokens, bfloat16, steps 2..{args.steps} (logs in {workdir})")
    print(f"  hf rollout through verl's agent loop : {r_tokens:7.0f} tokens in {r_seconds:6.1f} s = {rollout_tps:6.1f} tokens/s")
    print(f"  plain transformers generate          : {g_tokens:7.0f} tokens in {g_seconds:6.1f} s = {generate_tps:6.1f} tokens/s")
    print(f"  ratio rollout / generate = {rollout_tps / generate_tps:.2f} (goal >= 0.7)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
