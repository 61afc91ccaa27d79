"""Actor-update time and peak memory of the ``simko`` policy loss against ``vanilla`` on the same batch, in one run.

Builds verl 0.9.1's own FSDP engine (``FSDPEngineWithLMHead``, FSDP2, one process, gloo) around a random Qwen2-shaped
model with Qwen2.5's vocabulary (151,936 tokens: SimKO's extra work is per token x vocabulary), and runs
``engine.train_batch`` (forward, backward, optimizer step) with verl's ``ppo_loss`` bound to an actor config with
``policy_loss.loss_mode`` ``vanilla`` or ``simko``, alternating the two, and prints the median times and the ratio
(goal: simko / vanilla <= 1.15). The ratio is taken from the process's CPU time with one torch thread, which other
jobs on a shared machine do not inflate; the wall time is printed next to it. Peak memory is measured in a separate
step per mode with torch's ``MemTracker``
(every tensor allocated during the step, on CPU as on GPU).

    python benchmarks/simko_update.py                      # defaults below
    python benchmarks/simko_update.py --quick              # a smoke run
    python benchmarks/simko_update.py --calculate-entropy  # verl computes the entropy (SimKO reuses it)
    python benchmarks/simko_update.py --remove-padding     # verl's packed (remove-padding) layout

The model is small so that it runs on a CPU; there the LM head (tokens x hidden x vocabulary) is a much larger share
of the step than in Qwen2.5-Math-1.5B/7B, so the ratio here is an upper bound for those models.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
import verl  # noqa: F401  loads the capo-verl plugin (the simko loss and the engine patch)
from omegaconf import OmegaConf
from tensordict import TensorDict

from capo_verl.cpu.models import tiny_model_checkpoint


def build_engine(path: Path, hidden: int, layers: int, vocab: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine import EngineRegistry

    tiny_model_checkpoint(path, seed=0)  # tokenizer and chat template; the model is replaced below
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=max(1, hidden // 128),
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        initializer_range=0.02,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(path)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    dist.init_process_group("gloo", rank=0, world_size=1)
    model_config = HFModelConfig(path=str(path), override_config={"attn_implementation": "sdpa"})
    model_config.model_type = "language_model"
    fp32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}  # bf16 matmuls are slow on CPU
    engine = EngineRegistry.new(
        model_type="language_model",
        backend="fsdp2",
        model_config=model_config,
        engine_config=FSDPEngineConfig(
            strategy="fsdp2", use_torch_compile=False, model_dtype="fp32", mixed_precision=fp32
        ),
        optimizer_config=FSDPOptimizerConfig(lr=1e-6),
        checkpoint_config=CheckpointConfig(),
    )
    engine.initialize()
    return engine


def make_batch(bs: int, prompt_len: int, response_len: int, vocab: int, seed: int = 0) -> TensorDict:
    """Left-padded prompts and right-padded responses of random lengths (verl's trainer layout), +-1 advantages."""
    g = torch.Generator().manual_seed(seed)
    p_lens = torch.randint(prompt_len // 2, prompt_len + 1, (bs,), generator=g)
    r_lens = torch.randint(response_len // 2, response_len + 1, (bs,), generator=g)
    prompts = torch.zeros(bs, prompt_len, dtype=torch.long)
    responses = torch.zeros(bs, response_len, dtype=torch.long)
    attention = torch.zeros(bs, prompt_len + response_len, dtype=torch.long)
    for i in range(bs):
        prompts[i, prompt_len - p_lens[i] :] = torch.randint(3, vocab, (int(p_lens[i]),), generator=g)
        responses[i, : r_lens[i]] = torch.randint(3, vocab, (int(r_lens[i]),), generator=g)
        attention[i, prompt_len - p_lens[i] : prompt_len + r_lens[i]] = 1
    response_mask = attention[:, prompt_len:].clone()
    advantages = torch.where(torch.arange(bs) % 2 == 0, 1.0, -1.0).unsqueeze(1) * response_mask
    old_log_probs = -torch.rand(bs, response_len, generator=g) * 12 * response_mask  # ratios far from 1: some clip
    return TensorDict(
        {
            "input_ids": torch.cat([prompts, responses], 1),
            "attention_mask": attention,
            "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
            "response_mask": response_mask,
            "prompts": prompts,
            "responses": responses,
            "old_log_probs": old_log_probs,
            "advantages": advantages,
        },
        batch_size=[bs],
    )


def actor_config(loss_mode: str, bs: int):
    from verl.utils.config import omega_conf_to_dataclass

    return omega_conf_to_dataclass(
        OmegaConf.create(
            {
                "_target_": "verl.workers.config.FSDPActorConfig",
                "strategy": "fsdp2",
                "rollout_n": 1,
                "ppo_mini_batch_size": bs,
                "ppo_micro_batch_size_per_gpu": bs,
                "use_dynamic_bsz": False,
                "policy_loss": {"_target_": "verl.workers.config.PolicyLossConfig", "loss_mode": loss_mode},
                "loss_agg_mode": "seq-mean-token-mean",
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--batch", type=int, default=4, help="responses in the (single) micro-batch")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--response-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--calculate-entropy", action="store_true", help="actor.calculate_entropy=true")
    parser.add_argument("--remove-padding", action="store_true", help="model.use_remove_padding=true")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: the process's CPU time is then the update's compute time, "
        "which other jobs on the machine do not inflate; the ratio is taken from it)",
    )
    parser.add_argument("--quick", action="store_true", help="tiny shapes, 2 repeats")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.quick:
        args.hidden, args.layers, args.vocab, args.batch = 64, 2, 4096, 2
        args.prompt_len, args.response_len, args.repeats = 32, 64, 2

    from torch.distributed._tools.mem_tracker import MemTracker
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import left_right_2_no_padding

    with tempfile.TemporaryDirectory() as tmp:
        engine = build_engine(Path(tmp) / "model", args.hidden, args.layers, args.vocab)
    batch = make_batch(args.batch, args.prompt_len, args.response_len, args.vocab)
    tokens = int(batch["attention_mask"].sum())
    loss_fns = {mode: partial(ppo_loss, config=actor_config(mode, args.batch)) for mode in ("vanilla", "simko")}

    def step(mode: str):
        data = left_right_2_no_padding(batch.clone())
        tu.assign_non_tensor(
            data,
            temperature=1.0,
            use_remove_padding=args.remove_padding,
            calculate_entropy=args.calculate_entropy,
            use_dynamic_bsz=False,
            micro_batch_size_per_gpu=args.batch,
            max_token_len_per_gpu=None,
            global_batch_size=args.batch,
            use_fused_kernels=False,
        )
        with engine.train_mode():
            t0, c0 = time.perf_counter(), time.process_time()
            engine.train_batch(data, loss_fns[mode])
            return time.perf_counter() - t0, time.process_time() - c0

    for mode in loss_fns:  # warm-up
        step(mode)
    times: dict[str, list[float]] = {mode: [] for mode in loss_fns}
    cpu: dict[str, list[float]] = {mode: [] for mode in loss_fns}
    for r in range(args.repeats):
        for mode in ("vanilla", "simko") if r % 2 == 0 else ("simko", "vanilla"):
            wall, used = step(mode)
            times[mode].append(wall)
            cpu[mode].append(used)
            print(
                f"repeat {r + 1}/{args.repeats}: {mode} {wall:.3f} s wall, {used:.3f} s CPU",
                file=sys.stderr,
                flush=True,
            )
    peaks = {}
    for mode in loss_fns:
        tracker = MemTracker()
        tracker.track_external(engine.module)
        with tracker:
            step(mode)
        peaks[mode] = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]

    median = {mode: statistics.median(ts) for mode, ts in times.items()}
    median_cpu = {mode: statistics.median(ts) for mode, ts in cpu.items()}
    print(
        f"model: hidden {args.hidden}, {args.layers} layers, vocabulary {args.vocab}; batch {args.batch} "
        f"responses, {tokens} tokens; remove_padding={args.remove_padding}, "
        f"calculate_entropy={args.calculate_entropy}; {args.threads} thread(s), {args.repeats} interleaved repeats"
    )
    print(f"{'loss':<8} {'CPU time (median)':>18} {'wall (median)':>14} {'peak memory':>12}   CPU time of each repeat")
    for mode in loss_fns:
        runs = " ".join(f"{t:.2f}" for t in cpu[mode])
        print(f"{mode:<8} {median_cpu[mode]:>16.3f} s {median[mode]:>12.3f} s {peaks[mode] / 2**20:>8.0f} MiB   {runs}")
    print(
        f"simko / vanilla: update time x{median_cpu['simko'] / median_cpu['vanilla']:.3f} (CPU time; goal <= 1.15; "
        f"wall x{median['simko'] / median['vanilla']:.3f}), peak memory x{peaks['simko'] / peaks['vanilla']:.3f} "
        f"(+{(peaks['simko'] - peaks['vanilla']) / 2**20:.0f} MiB)"
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
