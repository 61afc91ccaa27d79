"""One actor update of verl 0.9.1's own FSDP engine in one process, on the CPU or on CUDA, and the two compared.

What a run does (world size 1; the process group is verl's ``initialize_global_process_group_ray``: gloo through
capo-verl's CPU platform on the CPU, ``cpu:gloo,cuda:nccl`` on CUDA):

1. Inputs, made once on the CPU and shared by every run that names the same ``--inputs`` folder: a tiny random
   Qwen2 (``capo_verl.cpu.models.tiny_model_checkpoint``: 2 layers, width 128, vocabulary 384, ``init_std`` 0.5 so its
   next-token distributions are peaked) and a batch in verl's trainer layout: 4 GSM8K questions in the chat
   template (left padding) x 4 responses sampled from that model and cut at 8 to 32 tokens (right padding),
   0/1 outcomes with 3 mixed groups and one all-correct one.
2. Two engines from verl's ``EngineRegistry`` (FSDP2, float32 parameters and compute, SDPA attention,
   ``use_remove_padding``, gradient checkpointing, dynamic batch size at 512 tokens: 3 micro-batches), built
   as verl's ``ActorRolloutRefWorker.init_model`` builds them: the actor (AdamW, lr 1e-5, clip 1.0) and the
   reference (``forward_only``, so verl's FSDP2 ``CPUOffloadPolicy``; ``param_offload`` as the paper's recipe).
3. ``old_log_probs`` from the actor's ``infer_batch`` and ``ref_log_prob`` from the reference's, converted as
   ``RayPPOTrainer._compute_old_log_prob`` / ``_compute_ref_log_prob`` do (``left_right_2_no_padding``, then
   ``no_padding_2_padding``); then the advantages from verl's ``ray_trainer.compute_advantage`` with
   ``adv_estimator=capo`` (capo-verl's wrapper hands CAPO both log-probs). CAPO's noise-mask thresholds sit in
   gaps of this batch's reference perplexities (:func:`pick_thresholds`, chosen by the first CPU run and stored
   with the inputs), so the mask drops about half of each side and no response is near a threshold.
4. Update 1: verl's ``ppo_loss`` bound to an ``FSDPActorConfig`` with ``policy_loss.loss_mode=vanilla``, through
   ``engine.train_batch`` (forward, backward per micro-batch, gradient clipping, one AdamW step): verl's loss and
   grad norm. Update 2: ``old_log_probs`` again from the updated actor, CAPO's advantages again, and
   ``loss_mode=simko`` (top-K 3, alpha 0.1, entropy quantile 0.8, top-1 penalty 1.1).

``run`` writes every number to a JSON file (``--repeat N`` builds the engines N times in the process and records
each run). ``compare`` reads a CPU run and a CUDA run of the same inputs and checks each quantity against its
tolerance (:data:`TOLERANCES`); its JSON lists every measured difference next to its tolerance.

Tolerances, float32 on both devices (the CPU run is the reference). The measured analog: on the CPU, verl's padded
layout (``use_remove_padding=False``) against its packed one runs the same math in another order, as CUDA's kernels
do, and differs by 1.1e-5 nats in the log-probs before any step, 7.6e-5 after update 1's step, 2.6e-6 in the
advantages, 5.8e-6 (relative) in the loss and 9.5e-6 (relative) in the grad norm. The tolerances are 10x or more:

- ``ref_log_prob`` and update 1's ``old_log_probs`` (per token): 1e-4 nats absolute. ``init_std`` 0.5 gives logits
  of tens, whose float32 rounding over 128-wide dot products is ~1e-5 (verl leaves TF32 off; the record says).
- update 2's ``old_log_probs``: 1e-3 nats. They come after one AdamW step on each device; Adam's first step moves
  every weight by about lr whatever the size of its gradient, so a gradient entry that is rounding noise can move
  its weight the other way. Update 1 itself changes them by ~0.5 nats (``update_effect``).
- advantages (one per response): 1e-4 absolute, and the set of responses with zero advantage (masked, or in the
  all-correct group) equal: every reference perplexity is at least 1% from its mask threshold (checked).
- loss: 1e-4 relative (to at least 1e-2): a float32 token mean of PPO terms of order 1.
- grad norm: 1e-3 relative. SimKO's entropy gate (the 80% quantile per response) can flip for a token whose
  entropy sits within rounding of the quantile, which changes that token's gradient by alpha (0.1) out of ~340
  tokens. A wrong device path or a lost micro-batch moves the norm by tens of percent.

Usage:

    python tests/gpu/actor_update_check.py run --device cpu --inputs DIR --json cpu.json [--repeat 2]
    python tests/gpu/actor_update_check.py run --device cuda --inputs DIR --json cuda.json
    python tests/gpu/actor_update_check.py compare cpu.json cuda.json --json compare.json

``--device cpu`` sets ``VERL_PLATFORM=cpu`` and hides CUDA (``CUDA_VISIBLE_DEVICES=""``) before torch and verl are
imported, so verl takes capo-verl's CPU platform, on a GPU machine too: there hiding CUDA alone is not enough, as
verl's platform detection (``verl/plugin/platform/platform_manager.py``: ``_detect_platform_name``) asks
``PlatformCUDA.is_platform_available(use_smi_check=True)``, which answers True wherever ``nvidia-smi`` runs, and only
``VERL_PLATFORM`` overrides it. ``--device cuda`` without CUDA stops at once (exit status 2).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import socket
import sys
import time
from functools import partial
from pathlib import Path

BS_PROMPTS, N_RESPONSES, PROMPT_LEN, RESPONSE_LEN = 4, 4, 48, 32
BS = BS_PROMPTS * N_RESPONSES
MAX_TOKENS = 512  # per micro-batch (use_dynamic_bsz): 3 micro-batches, gradient accumulation
LR = 1e-5
CORRECT = ((1, 0, 1, 0), (1, 1, 0, 0), (0, 0, 0, 1), (1, 1, 1, 1))  # per group: 3 mixed, 1 all-correct
CAPO = {"tau": 0.6, "use_mask": True, "normalize": "none", "reward_threshold": 0.5}
SIMKO = {"top_k": 3, "alpha": 0.1, "entropy_quantile": 0.8, "top1_penalty": 1.1}
MIN_THRESHOLD_MARGIN = 0.01  # every reference perplexity at least 1% away from its side's mask threshold
FP32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}

#: quantity -> (kind, tolerance); kinds: "abs" (max |a - b|), "rel" (|a - b| / max(|b|, floor)), "equal"; update 2
#: ("simko") takes AFTER_STEP's tolerance where it has one (its old_log_probs come after update 1's AdamW step)
TOLERANCES = {
    "old_log_probs": ("abs", 1e-4),
    "ref_log_prob": ("abs", 1e-4),
    "advantages": ("abs", 1e-4),
    "zero_advantage": ("equal", None),
    "loss": ("rel", 1e-4),
    "grad_norm": ("rel", 1e-3),
}
AFTER_STEP = {"old_log_probs": 1e-3}
REL_FLOOR = {"loss": 1e-2, "grad_norm": 1e-6}  # below these magnitudes "rel" is relative to the floor


def fail(message: str, status: int = 2):
    print(message, file=sys.stderr)
    raise SystemExit(status)


# ------------------------------------------------------------------------------------------------- inputs


def make_inputs(folder: Path) -> None:
    """Write the tiny model and the batch (``batch.pt``) to ``folder``; all on the CPU, seeded."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from capo_verl.cpu.models import tiny_model_checkpoint
    from capo_verl.stored import read_text

    model_dir = folder / "model"
    tiny_model_checkpoint(model_dir, init_std=0.5, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    questions = []
    data = Path(__import__("capo_verl").__file__).parent / "resources" / "train" / "gsm8k_train.jsonl"
    for line in read_text(data).split("\n")[:BS_PROMPTS]:  # shipped compressed: gsm8k_train.jsonl.gz
        questions.append(json.loads(line)["question"])
    prompts = torch.full((BS_PROMPTS, PROMPT_LEN), tokenizer.pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros(BS_PROMPTS, PROMPT_LEN, dtype=torch.long)
    for i, q in enumerate(questions):
        chat = [{"role": "user", "content": q}]
        ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=True)
        ids = list(ids["input_ids"])[-PROMPT_LEN:]  # the question's end and the template's tail
        prompts[i, PROMPT_LEN - len(ids) :] = torch.tensor(ids)
        prompt_mask[i, PROMPT_LEN - len(ids) :] = 1
    prompts = prompts.repeat_interleave(N_RESPONSES, 0)
    prompt_mask = prompt_mask.repeat_interleave(N_RESPONSES, 0)

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    torch.manual_seed(1)
    with torch.no_grad():
        out = model.generate(
            input_ids=prompts,
            attention_mask=prompt_mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=RESPONSE_LEN,
            min_new_tokens=4,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    responses = torch.full((BS, RESPONSE_LEN), tokenizer.pad_token_id, dtype=torch.long)
    generated = out[:, PROMPT_LEN:]
    responses[:, : generated.shape[1]] = generated
    response_mask = torch.zeros(BS, RESPONSE_LEN, dtype=torch.long)
    g = torch.Generator().manual_seed(2)
    cut = torch.randint(RESPONSE_LEN // 4, RESPONSE_LEN + 1, (BS,), generator=g)  # truncated rollouts
    for i in range(BS):
        eos = (responses[i] == tokenizer.eos_token_id).nonzero()
        length = min(int(eos[0]) + 1 if len(eos) else RESPONSE_LEN, int(cut[i]))
        response_mask[i, :length] = 1
        responses[i, length:] = tokenizer.pad_token_id
    attention = torch.cat([prompt_mask, response_mask], 1)
    correct = torch.tensor([c for group in CORRECT for c in group], dtype=torch.float32)
    rewards = torch.zeros(BS, RESPONSE_LEN)
    rewards[torch.arange(BS), response_mask.sum(-1) - 1] = correct
    batch = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": attention,
        "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
        "response_mask": response_mask,
        "token_level_rewards": rewards,
    }
    torch.save(batch, folder / "batch.pt")


def load_inputs(folder: Path) -> tuple[Path, dict, list[str]]:
    import numpy as np
    import torch

    batch = torch.load(folder / "batch.pt")
    uids = [f"question-{i}" for i in range(BS_PROMPTS) for _ in range(N_RESPONSES)]
    return folder / "model", batch, np.array(uids, dtype=object)


def digest(tensors: dict) -> str:
    """sha256 over the named tensors' bytes, in name order: the same inputs on every device."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        value = tensors[name].contiguous().cpu()
        h.update(name.encode())
        h.update(value.numpy().tobytes())
    return h.hexdigest()


# ------------------------------------------------------------------------------------------------- engines


def init_process_group() -> str:
    import torch.distributed as dist
    from verl.utils.distributed import initialize_global_process_group_ray

    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        initialize_global_process_group_ray(timeout_second=None)  # what verl's workers call
    assert dist.get_world_size() == 1
    return str(dist.get_backend())


def build_engines(model_dir: Path):
    """``(actor, ref)``: verl's FSDP engines, configured as ``ActorRolloutRefWorker.init_model`` configures them."""
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine import EngineRegistry

    engines = []
    for role in ("actor", "ref"):
        model_config = HFModelConfig(
            path=str(model_dir),
            override_config={"attn_implementation": "sdpa"},
            use_remove_padding=True,
            enable_gradient_checkpointing=True,
        )
        model_config.model_type = "language_model"
        engine_config = FSDPEngineConfig(
            strategy="fsdp2",
            forward_only=role == "ref",
            param_offload=role == "ref",
            use_torch_compile=False,
            model_dtype="fp32",
            mixed_precision=dict(FP32),
            use_dynamic_bsz=True,
            max_token_len_per_gpu=MAX_TOKENS,
            infer_max_token_len_per_gpu=MAX_TOKENS,
            use_remove_padding=True,
        )
        engine = EngineRegistry.new(
            model_type="language_model",
            backend="fsdp2",
            model_config=model_config,
            engine_config=engine_config,
            optimizer_config=FSDPOptimizerConfig(lr=LR, clip_grad=1.0),
            checkpoint_config=CheckpointConfig(),
        )
        engine.initialize()
        engines.append(engine)
    return engines


def actor_config(loss_mode: str):
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass

    policy_loss = {"_target_": "verl.workers.config.PolicyLossConfig", "loss_mode": loss_mode}
    if loss_mode == "simko":
        policy_loss["simko"] = dict(SIMKO)
    raw = {
        "_target_": "verl.workers.config.FSDPActorConfig",
        "strategy": "fsdp2",
        "rollout_n": N_RESPONSES,
        "ppo_mini_batch_size": BS_PROMPTS,
        "use_dynamic_bsz": True,
        "ppo_max_token_len_per_gpu": MAX_TOKENS,
        "policy_loss": policy_loss,
        "loss_agg_mode": "token-mean",
        "clip_ratio": 0.2,
    }
    return omega_conf_to_dataclass(OmegaConf.create(raw))


def _engine_data(batch: dict, **non_tensor):
    """The trainer's step: padded batch -> verl's no-padding TensorDict with the engine's keys."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    td = left_right_2_no_padding(TensorDict({k: v.clone() for k, v in batch.items()}, batch_size=[BS]))
    tu.assign_non_tensor(
        td,
        temperature=1.0,
        use_remove_padding=True,
        use_dynamic_bsz=True,
        max_token_len_per_gpu=MAX_TOKENS,
        micro_batch_size_per_gpu=BS,
        global_batch_size=BS,
        use_fused_kernels=False,
        **non_tensor,
    )
    return td


def log_probs(engine, batch: dict):
    """``RayPPOTrainer._compute_old_log_prob`` / ``_compute_ref_log_prob``: ``(bs, response_length)`` float32."""
    from verl.workers.utils.padding import no_padding_2_padding

    td = _engine_data(batch, calculate_entropy=False, compute_loss=False)
    with engine.eval_mode():
        out = engine.infer_batch(td, loss_function=None)
    values = out["model_output"]["log_probs"]
    return no_padding_2_padding(values, td).float().cpu() * batch["response_mask"]


def advantages(batch: dict, uids, thresholds: dict):
    """verl's ``compute_advantage`` with ``adv_estimator=capo``: ``(advantages (bs, T), capo step metrics)``."""
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.trainer.ppo import ray_trainer

    from capo_verl.estimators.common import pop_step_metrics

    config = OmegaConf.create(
        {"adv_estimator": "capo", "gamma": 1.0, "lam": 1.0, "norm_adv_by_std_in_grpo": True,
         "capo": {**CAPO, **thresholds}}
    )  # fmt: skip
    data = DataProto.from_dict(tensors=dict(batch), non_tensors={"uid": uids}, meta_info={"global_steps": 1})
    pop_step_metrics()
    out = ray_trainer.compute_advantage(
        data, adv_estimator="capo", gamma=1.0, lam=1.0, num_repeat=N_RESPONSES, norm_adv_by_std_in_grpo=True,
        config=config,
    )  # fmt: skip
    return out.batch["advantages"].float(), pop_step_metrics()


def train(engine, batch: dict, loss_mode: str) -> dict:
    """One ``engine.train_batch`` with verl's ``ppo_loss`` for ``loss_mode``: loss, grad norm and metrics."""
    from verl.utils.metric import Metric
    from verl.workers.utils.losses import ppo_loss

    td = _engine_data(batch, calculate_entropy=False, compute_loss=True)
    loss_fn = partial(ppo_loss, config=actor_config(loss_mode))  # as engine_workers binds it
    with engine.train_mode():
        out = engine.train_batch(td, loss_fn)
    metrics = {}
    for key, value in out["metrics"].items():
        if isinstance(value, list):
            value = Metric.aggregate_dp(value) if value and isinstance(value[0], Metric) else value
        if isinstance(value, Metric):
            value = value.aggregate()
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        if isinstance(value, (int, float)) or getattr(value, "numel", lambda: 0)() == 1:
            metrics[key] = float(value)
    return {
        "loss": float(sum(out["loss"])),  # TrainingWorker._postprocess_output sums the micro-batches' losses
        "grad_norm": float(out["metrics"]["grad_norm"]),
        "micro_batches": len(out["loss"]),
        "metrics": metrics,
    }


def pick_thresholds(ref_log_prob, batch: dict) -> dict:
    """CAPO's ``ref_high`` / ``ref_low`` at the geometric middle of a gap between the correct / incorrect
    responses' sorted reference perplexities: the wider of the two gaps next to the median, so that the mask drops
    about half of each side, or the widest gap of all where those two would leave a response within
    :data:`MIN_THRESHOLD_MARGIN` of the threshold."""
    import torch

    mask = batch["response_mask"].float()
    ppl = torch.exp(-(ref_log_prob * mask).sum(-1) / mask.sum(-1))
    correct = batch["token_level_rewards"].sum(-1) > 0.5
    out = {}
    for key, side in (("ref_high", correct), ("ref_low", ~correct)):
        values = sorted(float(v) for v in ppl[side])
        n = len(values)
        ratio = [math.inf] + [values[k] / values[k - 1] for k in range(1, n)]  # ratio[k]: the gap below values[k]
        i = max(range(max(1, (n - 1) // 2), min(n - 1, n // 2 + 1) + 1), key=ratio.__getitem__)
        if math.sqrt(ratio[i]) - 1 < MIN_THRESHOLD_MARGIN:
            i = max(range(1, n), key=ratio.__getitem__)
        out[key] = math.sqrt(values[i - 1] * values[i])
    return out


def threshold_margin(ref_log_prob, batch: dict, thresholds: dict) -> float:
    """Smallest relative distance of a correct response's reference perplexity to ``ref_high`` and of an incorrect
    one's to ``ref_low`` (the threshold each is masked by)."""
    import torch

    mask = batch["response_mask"].float()
    ppl = torch.exp(-(ref_log_prob * mask).sum(-1) / mask.sum(-1))
    correct = batch["token_level_rewards"].sum(-1) > 0.5
    return min(abs(float(p) / thresholds["ref_high" if c else "ref_low"] - 1) for p, c in zip(ppl, correct.tolist()))


def per_response(adv, mask):
    return ((adv * mask).sum(-1) / mask.sum(-1)).tolist()


def one_run(model_dir: Path, batch: dict, uids, thresholds: dict | None) -> dict:
    import torch

    clock = time.perf_counter()
    seconds: dict[str, float] = {}

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        seconds[name] = seconds.get(name, 0.0) + now - clock
        clock = now

    actor, ref = build_engines(model_dir)
    lap("engines")
    mask = batch["response_mask"].float()
    result: dict = {"updates": {}, "phase_seconds": seconds}
    ref_lp = log_probs(ref, batch)
    lap("ref_log_prob")
    if thresholds is None:
        thresholds = pick_thresholds(ref_lp, batch)
    result["thresholds"] = thresholds
    result["threshold_margin"] = threshold_margin(ref_lp, batch, thresholds)
    previous = None
    for loss_mode in ("vanilla", "simko"):
        old = log_probs(actor, batch)
        lap("old_log_probs")
        step = {**batch, "old_log_probs": old, "ref_log_prob": ref_lp}
        adv, capo_metrics = advantages(step, uids, thresholds)
        lap("compute_advantage")
        update = train(actor, {**step, "advantages": adv}, loss_mode)
        lap(f"update_{loss_mode}")
        zero = [i for i, a in enumerate(adv.abs().amax(-1).tolist()) if a == 0]
        update.update(
            old_log_probs=old.tolist(),
            ref_log_prob=ref_lp.tolist(),
            advantages=per_response(adv, mask),
            zero_advantage=zero,
            capo_metrics={k: float(v) for k, v in capo_metrics.items()},
            finite=all(math.isfinite(x) for x in (update["loss"], update["grad_norm"]))
            and bool(torch.isfinite(old).all() and torch.isfinite(adv).all()),
        )
        if previous is not None:
            update["update_effect"] = float((old - previous).abs().max())  # what update 1 changed
        previous = old
        result["updates"][loss_mode] = update
    del actor, ref
    return result


def environment(device: str) -> dict:
    import platform

    import torch
    import transformers
    import verl

    info = {
        "device": device,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "verl": verl.__version__,
        "torch_threads": torch.get_num_threads(),
    }
    if device == "cuda":
        info["device_name"] = torch.cuda.get_device_name(0)
        info["tf32_matmul"] = bool(torch.backends.cuda.matmul.allow_tf32)
    return info


def run(args) -> int:
    if args.device == "cpu":  # before torch and verl: verl then takes capo-verl's CPU platform (module docstring)
        os.environ["VERL_PLATFORM"] = "cpu"  # verl's detection picks CUDA wherever nvidia-smi runs, CUDA hidden or not
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # the tiny model: one thread is fastest, and alone on a busy CPU
    import torch

    if args.device == "cpu":
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

    if args.device == "cuda" and not torch.cuda.is_available():
        fail(f"actor_update_check --device cuda needs CUDA: torch {torch.__version__} finds no CUDA device")
    t0 = time.perf_counter()
    import verl  # noqa: F401  loads capo-verl's plugin through its entry point, as a run does
    from verl.trainer.ppo import ray_trainer
    from verl.utils.device import get_device_name

    if not getattr(ray_trainer.compute_advantage, "__wrapped_by_capo_verl__", False):
        fail("capo-verl's compute_advantage wrapper is not installed: is capo-verl's verl.plugins entry point found?")
    if get_device_name() != args.device:
        fail(f"verl's device is {get_device_name()!r}, not {args.device!r}")
    inputs = Path(args.inputs)
    inputs.mkdir(parents=True, exist_ok=True)
    if not (inputs / "batch.pt").is_file():
        if args.device != "cpu":
            fail(f"{inputs}/batch.pt is missing: run the CPU reference first (run --device cpu --inputs {inputs})")
        make_inputs(inputs)
    model_dir, batch, uids = load_inputs(inputs)
    thresholds_file = inputs / "thresholds.json"
    thresholds = json.loads(thresholds_file.read_text()) if thresholds_file.is_file() else None
    backend = init_process_group()
    record = {
        **environment(args.device),
        "backend": backend,
        "inputs_sha256": digest(batch),
        "shapes": {"sequences": BS, "prompt_len": PROMPT_LEN, "response_len": RESPONSE_LEN,
                   "response_tokens": int(batch["response_mask"].sum()), "max_tokens_per_micro_batch": MAX_TOKENS},
        "runs": [],
    }  # fmt: skip
    for _ in range(args.repeat):
        start = time.perf_counter()
        result = one_run(model_dir, batch, uids, thresholds)
        result["seconds"] = time.perf_counter() - start
        if thresholds is None:
            thresholds = result["thresholds"]
            thresholds_file.write_text(json.dumps(thresholds, indent=1))
        record["runs"].append(result)
        if args.device == "cuda":
            torch.cuda.synchronize()
    record["seconds"] = time.perf_counter() - t0
    problems = check_run(record)
    record["problems"] = problems
    Path(args.json).write_text(json.dumps(record, indent=1))
    for loss_mode, update in record["runs"][0]["updates"].items():
        print(
            f"{args.device} {loss_mode}: loss {update['loss']:.6g}, grad norm {update['grad_norm']:.6g}, "
            f"{update['micro_batches']} micro-batches, zero-advantage responses {update['zero_advantage']}"
        )
    for problem in problems:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    return 1 if problems else 0


def check_run(record: dict) -> list[str]:
    """What one run must show by itself: finite numbers, SimKO's branch taken, the mask on both sides, and (with
    ``--repeat``) identical runs."""
    problems = []
    first = record["runs"][0]
    for loss_mode, update in first["updates"].items():
        if not update["finite"]:
            problems.append(f"{loss_mode}: a loss, grad norm, log-prob or advantage is not finite")
        if not update["grad_norm"] > 0:
            problems.append(f"{loss_mode}: grad norm {update['grad_norm']} is not positive")
        if not 0 < update["capo_metrics"].get("capo/mask_frac_correct", 0) < 1:
            problems.append(f"{loss_mode}: CAPO's mask does not act on part of the correct responses")
        if not 0 < update["capo_metrics"].get("capo/mask_frac_incorrect", 0) < 1:
            problems.append(f"{loss_mode}: CAPO's mask does not act on part of the incorrect responses")
    simko = first["updates"]["simko"]["metrics"]
    if not simko.get("simko/forking_frac", 0) > 0:
        problems.append("simko: no forking token (simko/forking_frac missing or 0): SimKO's branch not exercised")
    if not first["updates"]["simko"].get("update_effect", 0) > 0:
        problems.append("update 1 did not change the actor's log-probs")
    if first["threshold_margin"] < MIN_THRESHOLD_MARGIN:
        problems.append(f"a reference perplexity is within {first['threshold_margin']:.2%} of a mask threshold")
    for i, other in enumerate(record["runs"][1:], start=2):
        for loss_mode, update in first["updates"].items():
            for key in ("loss", "grad_norm", "old_log_probs", "ref_log_prob", "advantages", "zero_advantage"):
                if other["updates"][loss_mode][key] != update[key]:
                    problems.append(f"run {i} differs from run 1: {loss_mode} {key}")
    return problems


# ------------------------------------------------------------------------------------------------- compare


def _max_abs(a, b) -> float:
    if isinstance(a, list):
        return max((_max_abs(x, y) for x, y in zip(a, b, strict=True)), default=0.0)
    return abs(a - b)


def compare_records(reference: dict, candidate: dict) -> dict:
    """Every quantity of both updates: the measured difference, its tolerance, and whether it held."""
    rows = []
    if reference["inputs_sha256"] != candidate["inputs_sha256"]:
        rows.append({"update": "-", "quantity": "inputs_sha256", "kind": "equal", "measured": None,
                     "tolerance": None, "ok": False})  # fmt: skip
    ref_run, cand_run = reference["runs"][0], candidate["runs"][0]
    for loss_mode, ref_update in ref_run["updates"].items():
        cand_update = cand_run["updates"][loss_mode]
        for quantity, (kind, tolerance) in TOLERANCES.items():
            if loss_mode != "vanilla":
                tolerance = AFTER_STEP.get(quantity, tolerance)
            a, b = cand_update[quantity], ref_update[quantity]
            if kind == "equal":
                measured, ok = None, a == b
            elif kind == "abs":
                measured = _max_abs(a, b)
                ok = measured <= tolerance
            else:
                measured = abs(a - b) / max(abs(b), REL_FLOOR[quantity])
                ok = measured <= tolerance
            row = {"update": loss_mode, "quantity": quantity, "kind": kind, "measured": measured,
                   "tolerance": tolerance, "ok": bool(ok)}  # fmt: skip
            if quantity in ("loss", "grad_norm"):
                row.update(reference_value=b, candidate_value=a)
            rows.append(row)
        for update in (ref_update, cand_update):
            if not update["finite"]:
                rows.append({"update": loss_mode, "quantity": "finite", "kind": "equal", "measured": None,
                             "tolerance": None, "ok": False})  # fmt: skip
    effect = cand_run["updates"]["simko"].get("update_effect")
    return {
        "reference": {k: reference.get(k) for k in ("device", "device_name", "torch", "backend")},
        "candidate": {k: candidate.get(k) for k in ("device", "device_name", "torch", "backend")},
        "update_effect": effect,
        "rows": rows,
        "ok": all(row["ok"] for row in rows) and not reference.get("problems") and not candidate.get("problems"),
        "problems": {"reference": reference.get("problems", []), "candidate": candidate.get("problems", [])},
    }


def compare(args) -> int:
    for path in (args.reference, args.candidate):
        if not Path(path).is_file():
            fail(f"{path} is missing: its run failed (see its log)", status=1)
    reference = json.loads(Path(args.reference).read_text())
    candidate = json.loads(Path(args.candidate).read_text())
    result = compare_records(reference, candidate)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    print(f"{candidate.get('device')} against {reference.get('device')} (the same update, the same inputs):")
    for row in result["rows"]:
        measured = "-" if row["measured"] is None else f"{row['measured']:.3g}"
        tolerance = "exact" if row["tolerance"] is None else f"{row['tolerance']:.0e} ({row['kind']})"
        print(f"  {row['update']:<8} {row['quantity']:<14} {measured:>10}  <= {tolerance:<12} "
              f"{'ok' if row['ok'] else 'FAILED'}")  # fmt: skip
    for side, problems in result["problems"].items():
        for problem in problems:
            print(f"  {side}: {problem}")
    return 0 if result["ok"] else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="one actor update (or --repeat N) on a device; writes --json")
    p_run.add_argument("--device", choices=("cpu", "cuda"), required=True)
    p_run.add_argument("--inputs", required=True, help="folder of the shared inputs (made by the first CPU run)")
    p_run.add_argument("--json", required=True)
    p_run.add_argument("--repeat", type=int, default=1, help="build the engines and update this many times")
    p_cmp = sub.add_parser("compare", help="a run against a reference run of the same inputs")
    p_cmp.add_argument("reference")
    p_cmp.add_argument("candidate")
    p_cmp.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.command == "run":
        if args.repeat < 1:
            parser.error("--repeat must be >= 1")
        return run(args)
    return compare(args)


if __name__ == "__main__":
    sys.exit(main())
