"""verl glue for SimKO: ``actor_rollout_ref.actor.policy_loss.loss_mode=simko`` with the actor's top-K log-probs.

The loss (:mod:`capo_verl.losses.simko`, after CLR-Lab/SimKO@306f4ff4e84ace53e92501939692fcfeb32596b5
``verl/trainer/ppo/core_algos.py::compute_policy_loss_simko``) needs, per response token and from the forward pass
being trained: the current policy's top-K log-probs (with gradient), whether the sampled token is the top-1 token,
and the token entropy (detached). verl 0.9.1 hands a registered policy loss only
``(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights)``
(``verl/workers/utils/losses.py::ppo_loss``). This module, only when ``loss_mode=simko``:

1. **Engine** (``verl/workers/engine/fsdp/transformer_impl.py``): wraps
   ``FSDPEngineWithLMHead.prepare_model_outputs``, which turns the LM head's logits into ``log_probs`` (and
   ``entropy``). When the loss function the engine was given is verl's ``ppo_loss`` bound to an actor config with
   ``loss_mode=simko``, it adds three nested ``(bsz, j1, ...)`` tensors to the model output, aligned with
   ``log_probs`` (same packing, same temperature): ``simko_topk_gaps`` ``(.., K)`` = s_k - s_t (scaled logits of
   the top-K tokens minus the sampled token's, float32, with gradient; ``log_probs + gaps`` are the top-K log-probs,
   so the logsumexp verl already computed is reused: one ``topk`` and one gather of K + 1 logits per token; verl
   then computes on an alias of the logits whose gradient receives the gathered entries' in place, so no second
   logits-sized gradient buffer is allocated),
   ``simko_is_top1`` (float 0/1) and ``simko_entropy`` (verl's own entropy, detached, when
   ``actor.calculate_entropy`` or ``entropy_coeff`` turned it on; otherwise computed here without autograd in
   float32 chunks, with one ``exp`` pass). All of it only at the positions that predict a response token (zeros
   elsewhere; prompt positions never reach the loss). Both of verl's layouts are covered: remove-padding (packed
   ``(1, total_nnz)`` input; ``pad_to_length``'s static pad is a suffix, never used) and padded ``(bsz, max_len)``.
   Every other loss, and every forward without a loss (``compute_log_prob``), runs verl's method unchanged and
   nothing more is computed.
2. **Loss input** (``verl/workers/utils/losses.py``): wraps ``ppo_loss`` so that, for ``loss_mode=simko``, those
   tensors are unpacked to ``(bsz, response_length, ...)`` with verl's ``no_padding_2_padding`` (as ``log_probs``)
   and handed to the registered loss through a context variable; the loss's public signature is unchanged.
   The wrap lands before ``verl/workers/engine_workers.py`` binds ``ppo_loss`` by name.
3. **The loss** ``simko`` (``core_algos.register_policy_loss``): :func:`capo_verl.losses.simko.simko_terms`, then
   verl's own ``vanilla`` PPO-clip loss (clip ratios, dual clip, ``loss_agg_mode``, rollout-correction weights,
   its metrics) on SimKO's surrogate log-prob and advantages, plus ``simko/*`` diagnostics (logged by verl as
   ``actor/simko/*``).
4. **Config**: verl's ``PolicyLossConfig`` dataclass (``verl/workers/config/actor.py``) gets a ``simko`` field
   (a subclass replaces it where Hydra's ``_target_: verl.workers.config.PolicyLossConfig`` finds it), validated
   with errors naming ``actor_rollout_ref.actor.policy_loss.simko.<key>``; verl's ``validate_config``
   (``verl/utils/config.py``, run by ``main_ppo`` before any worker starts; hooked once for every capo-verl method
   in :mod:`capo_verl.compat.methods`, which calls :func:`check_simko_setup`) also refuses, naming the key and the
   fix, a ``top_k`` larger than the vocabulary of a local model, and what this plumbing does not cover: an actor
   strategy other than ``fsdp``/``fsdp2`` (Megatron, VeOmni, TorchTitan, AutoModel compute logits elsewhere),
   ``model.use_fused_kernels`` (no logits), Ulysses sequence parallelism (untested here) and distillation (a
   different loss function). The engine and the loss raise the
   same kind of error if they meet such a setup at run time anyway.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from capo_verl.losses.simko import (
    CONFIG_KEY,
    SOURCE,
    gaps_from_picked,
    gather_with_inplace_grad,
    parse_simko_config,
    simko_diagnostics,
    simko_terms,
    topk_and_entropy,
)

from .patching import after_import, patch

LOSS_MODE = "simko"
#: model-output keys added by the engine patch (nested like ``log_probs``)
GAPS_KEY, TOP1_KEY, ENTROPY_KEY = "simko_topk_gaps", "simko_is_top1", "simko_entropy"

_COVERED = (
    "capo-verl computes SimKO's top-K log-probs in verl's FSDP engine only (actor_rollout_ref.actor.strategy "
    "fsdp or fsdp2, FSDPEngineWithLMHead), without fused kernels, Ulysses sequence parallelism or distillation"
)


@dataclass
class SimKOInputs:
    """What the engine computed for the micro-batch, response-aligned like ``log_prob``.

    Attributes:
        topk_gaps: ``(bs, T, K)`` float32, s_k - s_t, with gradient.
        is_top1: ``(bs, T)`` bool.
        entropy: ``(bs, T)`` float32 nats, detached.
    """

    topk_gaps: torch.Tensor
    is_top1: torch.Tensor
    entropy: torch.Tensor


_INPUTS: contextvars.ContextVar[SimKOInputs | None] = contextvars.ContextVar("capo_verl_simko_inputs", default=None)


def loss_mode_of(actor_config) -> str:
    """``actor_config.policy_loss.loss_mode`` (ActorConfig dataclass or OmegaConf node), default ``vanilla``."""
    policy_loss = actor_config.get("policy_loss", None) if actor_config is not None else None
    if policy_loss is None:
        return "vanilla"
    return policy_loss.get("loss_mode", "vanilla")


def simko_params_of(actor_config):
    """The validated :class:`~capo_verl.losses.simko.SimKOParams` of an actor config with ``loss_mode=simko``."""
    return parse_simko_config(actor_config.policy_loss.get("simko", None))


# --- 4. config -------------------------------------------------------------------------------------------------------
@patch("verl.workers.config", {"PolicyLossConfig": None})
def _patch_policy_loss_config(config_pkg) -> None:
    """verl/workers/config: ``PolicyLossConfig`` with a ``simko`` field (validated, defaults filled in)."""
    original = config_pkg.PolicyLossConfig
    names = {f.name for f in dataclasses.fields(original)}
    if "loss_mode" not in names or "simko" in names:
        raise RuntimeError(
            f"capo_verl.compat.simko: verl's PolicyLossConfig has fields {sorted(names)}; expected 'loss_mode' and "
            "no 'simko' as in verl 0.9.1 (see capo_verl.compat.TESTED_VERL_VERSIONS)"
        )
    if getattr(original, "__capo_verl_simko__", False):
        return
    actor_module = sys.modules["verl.workers.config.actor"]

    @dataclass
    class SimKOPolicyLossConfig(original):
        """verl's ``PolicyLossConfig`` plus ``simko`` (:class:`capo_verl.losses.simko.SimKOParams` as a dict)."""

        simko: Any = None

        def __post_init__(self):
            parent = getattr(super(), "__post_init__", None)
            if parent is not None:
                parent()
            if self.simko is not None or self.loss_mode == LOSS_MODE:
                raw = self.simko
                if raw is not None and not isinstance(raw, dict):
                    from omegaconf import OmegaConf

                    raw = OmegaConf.to_container(raw, resolve=True) if OmegaConf.is_config(raw) else raw
                object.__setattr__(self, "simko", dataclasses.asdict(parse_simko_config(raw)))

    SimKOPolicyLossConfig.__capo_verl_simko__ = True
    SimKOPolicyLossConfig.__module__ = __name__
    SimKOPolicyLossConfig.__qualname__ = SimKOPolicyLossConfig.__name__ = "SimKOPolicyLossConfig"
    globals()["SimKOPolicyLossConfig"] = SimKOPolicyLossConfig
    config_pkg.PolicyLossConfig = SimKOPolicyLossConfig
    actor_module.PolicyLossConfig = SimKOPolicyLossConfig


def __getattr__(name):  # unpickling a SimKOPolicyLossConfig in a fresh process: import verl's config first
    if name == "SimKOPolicyLossConfig":
        import verl.workers.config  # noqa: F401  applies _patch_policy_loss_config

        if "SimKOPolicyLossConfig" in globals():
            return globals()[name]
    raise AttributeError(name)


def check_simko_setup(config) -> None:
    """Raise ValueError, naming the key and the fix, if ``config`` asks for SimKO where this plumbing cannot run.

    Also checks ``policy_loss.simko.top_k`` against the model's vocabulary when ``actor_rollout_ref.model.path`` is
    a local directory (:func:`local_vocab_size`; a non-local path is skipped silently). Called from verl's
    ``validate_config`` by :mod:`capo_verl.compat.methods`.

    Args:
        config: the full trainer config (OmegaConf), as verl's ``validate_config`` receives it.
    """
    actor = config.actor_rollout_ref.actor
    if loss_mode_of(actor) != LOSS_MODE:
        return
    prefix = "actor_rollout_ref.actor.policy_loss.loss_mode=simko"
    strategy = actor.get("strategy", None)
    if strategy not in ("fsdp", "fsdp2"):
        raise ValueError(
            f"{prefix} needs actor_rollout_ref.actor.strategy fsdp or fsdp2, got {strategy!r}: {_COVERED}. "
            "Use actor_rollout_ref.actor.strategy=fsdp2 (or another policy_loss.loss_mode)."
        )
    if config.actor_rollout_ref.model.get("use_fused_kernels", False):
        raise ValueError(
            f"{prefix} needs the logits, which actor_rollout_ref.model.use_fused_kernels=true never materializes: "
            "set actor_rollout_ref.model.use_fused_kernels=false."
        )
    for key in ("ulysses_sequence_parallel_size", "fsdp_config.ulysses_sequence_parallel_size"):
        node = actor
        for part in key.split("."):
            node = node.get(part, None) if node is not None else None
        if node not in (None, 1):
            raise ValueError(
                f"{prefix} is not covered with Ulysses sequence parallelism (actor_rollout_ref.actor.{key}={node}): "
                f"{_COVERED}. Set actor_rollout_ref.actor.{key}=1."
            )
    distillation = config.get("distillation", None)
    if distillation is not None and distillation.get("enabled", False):
        raise ValueError(f"{prefix} cannot be combined with distillation.enabled=true: {_COVERED}.")
    try:
        params = simko_params_of(actor)
    except ValueError as exc:
        raise ValueError(f"{prefix}: {exc}") from None
    vocab = local_vocab_size(config.actor_rollout_ref.model.get("path", None))
    if vocab is not None and params.top_k > vocab:
        raise ValueError(
            f"{CONFIG_KEY}.top_k={params.top_k} is larger than the vocabulary of actor_rollout_ref.model.path "
            f"({vocab} tokens, config.json vocab_size): the top-K tokens do not exist. Set {CONFIG_KEY}.top_k <= "
            f"{vocab} (the authors use 3)."
        )


def local_vocab_size(model_path) -> int | None:
    """The model's vocabulary size (``vocab_size`` of its ``config.json``, or of its ``text_config``) when
    ``model_path`` is a local directory; None when it is not (a hub id such as ``Qwen/Qwen2.5-Math-7B``, an
    ``hdfs://`` path, a directory that does not exist on this machine): such a path is skipped silently, and an
    out-of-range ``top_k`` then fails in ``torch.topk`` when the actor first computes SimKO's loss.

    Raises:
        ValueError: ``model_path`` is a local directory without a readable ``config.json`` holding an integer
            ``vocab_size``.
    """
    if not isinstance(model_path, (str, os.PathLike)):
        return None
    folder = Path(os.path.expanduser(os.fspath(model_path)))
    if not folder.is_dir():
        return None
    try:
        with open(folder / "config.json", encoding="utf-8") as f:
            model_config = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"actor_rollout_ref.model.path={model_path} is a local directory, but its config.json could not be read "
            f"({exc}); SimKO's policy_loss.simko.top_k is checked against the model's vocab_size"
        ) from None
    for node in (model_config, model_config.get("text_config") or {}):
        vocab = node.get("vocab_size") if isinstance(node, dict) else None
        if isinstance(vocab, int) and not isinstance(vocab, bool):
            return vocab
    raise ValueError(
        f"actor_rollout_ref.model.path={model_path}: config.json has no integer vocab_size; SimKO's "
        "policy_loss.simko.top_k is checked against it"
    )


# --- 1. engine: top-K gaps, top-1 mask and entropy next to log_probs -------------------------------------------------
def _simko_config_of_loss_function(loss_function):
    """The actor config if ``loss_function`` is verl's ``ppo_loss`` bound to an actor with ``loss_mode=simko``."""
    keywords = getattr(loss_function, "keywords", None)
    if not keywords or getattr(getattr(loss_function, "func", None), "__capo_verl_simko__", False) is False:
        return None
    config = keywords.get("config")
    if config is None or loss_mode_of(config) != LOSS_MODE:
        return None
    return config


def _runtime_error(what: str) -> RuntimeError:
    return RuntimeError(f"actor_rollout_ref.actor.policy_loss.loss_mode=simko: {what}. {_COVERED}.")


def _simko_model_outputs(engine, original, output, output_args, micro_batch, loss_function, top_k: int) -> dict:
    """verl's model output plus the three nested SimKO tensors for one micro-batch (see the module docstring)."""
    from torch.distributed.tensor import DTensor
    from verl.utils import tensordict_utils as tu

    get = functools.partial(tu.get_non_tensor_data, data=micro_batch)
    if get(key="use_fused_kernels", default=False):
        raise _runtime_error("fused kernels (actor_rollout_ref.model.use_fused_kernels=true) give no logits")
    if get(key="distillation_only", default=False):
        raise _runtime_error("a distillation-only forward computes no log_probs")
    if getattr(engine, "use_ulysses_sp", False):
        raise _runtime_error("Ulysses sequence parallelism is not covered")
    logits = output.logits
    if isinstance(logits, DTensor):
        raise _runtime_error("vocab-parallel (DTensor) logits are not covered")

    cu_seqlens = micro_batch["input_ids"].offsets()
    total = int(cu_seqlens[-1])
    unit_temperature = output_args.get("temperature_is_one", False)
    engine_config = getattr(engine, "engine_config", None)
    chunk = int(getattr(engine_config, "entropy_from_logits_chunk_size", 2048) or 2048)
    reuse_entropy = bool(get(key="calculate_entropy", default=False))  # verl computes it: reuse, detached
    # Only the positions that predict a response token reach the loss: compute there, zeros elsewhere.
    used = _response_positions(micro_batch, cu_seqlens)  # (n,) indices into the packed (total,) sequence
    labels = output_args["input_ids_rmpad_rolled"][used].to(torch.long)
    vocab = logits.shape[-1]

    if get(key="use_remove_padding", default=True):
        # (1, total + static pad, V): the pad is a suffix (no SP) and never selected
        rows = used
        temperature = None if unit_temperature else output_args["temperature_rmpad"][used]
    else:
        bsz, seq_len, _ = logits.shape
        lengths = cu_seqlens.diff()
        valid = torch.arange(seq_len, device=logits.device).unsqueeze(0) < lengths.unsqueeze(1)  # (bsz, S)
        rows = valid.reshape(-1).nonzero().squeeze(-1)[used]  # packed order = row-major valid positions
        temperature = None
        if not unit_temperature:
            temperature = output_args["temperature"].to(torch.float32).repeat_interleave(lengths)[used]

    top_index, entropy = topk_and_entropy(
        logits.reshape(-1, vocab), top_k, temperature, rows=rows, with_entropy=not reuse_entropy, chunk_size=chunk
    )
    index = torch.cat([labels.unsqueeze(-1), top_index], dim=-1)  # (n, 1 + K)
    # verl computes on the alias; the gathered entries' gradient is added into its gradient in place
    output.logits, picked = gather_with_inplace_grad(logits, rows, index)
    model_output = original(engine, output, output_args, micro_batch, loss_function)
    if "log_probs" not in model_output:
        raise _runtime_error("the engine computed no log_probs")
    gaps, is_top1 = gaps_from_picked(picked, temperature)
    if reuse_entropy:
        entropy = model_output["entropy"].values().detach().float()[used]

    def packed(values: torch.Tensor) -> torch.Tensor:
        full = values.new_zeros((total, *values.shape[1:]))
        return torch.nested.nested_tensor_from_jagged(full.index_put((used,), values), offsets=cu_seqlens)

    model_output.update(
        {
            GAPS_KEY: packed(gaps),
            TOP1_KEY: packed(is_top1.to(torch.float32)),
            ENTROPY_KEY: packed(entropy),
        }
    )
    return model_output


def _response_positions(micro_batch, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Indices, in the packed token order, of the positions whose next token is a response token.

    Sequence i (prompt p_i, response r_i tokens, ending at packed offset o_i) predicts its response at
    ``o_i - r_i - 1 ... o_i - 2``: the positions verl's ``no_padding_2_padding`` (``verl/workers/utils/padding.py``)
    slices for ``log_probs``, with the prompt and response lengths read the same way.
    """
    prompts, responses = micro_batch["prompts"], micro_batch["responses"]
    if prompts.is_nested:
        prompt_lens = prompts.offsets().diff()
        response_lens = responses.offsets().diff()
    else:
        attention_mask = micro_batch["attention_mask"]
        prompt_lens = attention_mask[:, : prompts.shape[1]].sum(dim=1)
        response_lens = attention_mask[:, prompts.shape[1] :].sum(dim=1)
    ends = cu_seqlens[1:].to(torch.long)
    if not torch.equal((prompt_lens + response_lens).to(torch.long), ends - cu_seqlens[:-1].to(torch.long)):
        raise _runtime_error("prompt and response lengths do not add up to the packed sequence lengths")
    response_lens = response_lens.to(torch.long)
    starts = ends - response_lens - 1
    first = torch.repeat_interleave(starts, response_lens)
    within = torch.arange(int(response_lens.sum()), device=ends.device) - torch.repeat_interleave(
        response_lens.cumsum(0) - response_lens, response_lens
    )
    return first + within


@patch(
    "verl.workers.engine.fsdp.transformer_impl",
    {
        "FSDPEngineWithLMHead.prepare_model_outputs": (
            "self", "output", "output_args", "micro_batch", "logits_processor_func"
        )
    },
)  # fmt: skip
def _patch_engine(impl) -> None:
    """verl/workers/engine/fsdp/transformer_impl.py: ``FSDPEngineWithLMHead.prepare_model_outputs``."""
    cls = impl.FSDPEngineWithLMHead
    original = cls.prepare_model_outputs
    if getattr(original, "__capo_verl_simko__", False):
        return

    @functools.wraps(original)
    def prepare_model_outputs(self, output, output_args, micro_batch, logits_processor_func):
        actor_config = _simko_config_of_loss_function(logits_processor_func)
        if actor_config is None:  # every other loss, and forwards without a loss: verl's method as it is
            return original(self, output, output_args, micro_batch, logits_processor_func)
        top_k = simko_params_of(actor_config).top_k
        return _simko_model_outputs(self, original, output, output_args, micro_batch, logits_processor_func, top_k)

    prepare_model_outputs.__capo_verl_simko__ = True
    cls.prepare_model_outputs = prepare_model_outputs


# --- 2. ppo_loss: the engine's tensors to the registered loss -------------------------------------------------------
@patch(
    "verl.workers.utils.losses",
    {"ppo_loss": ("config", "model_output", "data", "dp_group"), "no_padding_2_padding": ("tensor", "data")},
)
def _patch_ppo_loss(losses) -> None:
    """verl/workers/utils/losses.py: ``ppo_loss`` hands SimKO's tensors to the ``simko`` policy loss."""
    original = losses.ppo_loss
    if getattr(original, "__capo_verl_simko__", False):
        return
    no_padding_2_padding = losses.no_padding_2_padding

    @functools.wraps(original)
    def ppo_loss(config, model_output, data, dp_group=None):
        if loss_mode_of(config) != LOSS_MODE:
            return original(config=config, model_output=model_output, data=data, dp_group=dp_group)
        missing = [k for k in (GAPS_KEY, TOP1_KEY, ENTROPY_KEY) if k not in model_output]
        if missing:
            raise _runtime_error(f"the actor's engine did not compute {missing}")
        inputs = SimKOInputs(
            topk_gaps=no_padding_2_padding(model_output[GAPS_KEY], data),
            is_top1=no_padding_2_padding(model_output[TOP1_KEY], data) > 0.5,
            entropy=no_padding_2_padding(model_output[ENTROPY_KEY], data),
        )
        token = _INPUTS.set(inputs)
        try:
            return original(config=config, model_output=model_output, data=data, dp_group=dp_group)
        finally:
            _INPUTS.reset(token)

    ppo_loss.__capo_verl_simko__ = True
    losses.ppo_loss = ppo_loss


# --- 3. the registered loss -----------------------------------------------------------------------------------------
def compute_policy_loss_simko(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config=None,
    rollout_is_weights: torch.Tensor | None = None,
):
    """verl policy loss ``simko``: SimKO's surrogate log-prob and advantages in verl's ``vanilla`` PPO-clip loss.

    Args (verl's policy-loss signature): ``(bs, T)`` float ``old_log_prob``, ``log_prob`` (with gradient),
    ``advantages``, bool ``response_mask``, ``loss_agg_mode``, the actor config (``ActorConfig``; SimKO's parameters
    at ``policy_loss.simko``) and optional ``(bs, T)`` ``rollout_is_weights``. The top-K log-probs, top-1 mask and
    entropy of the same forward pass come from the engine through :func:`_patch_ppo_loss`.

    Returns:
        ``(pg_loss, metrics)``: verl's vanilla loss and metrics (``actor/pg_clipfrac``, ...) plus the ``simko/*``
        diagnostics of :func:`capo_verl.losses.simko.simko_diagnostics`.

    Raises:
        RuntimeError: called without the engine's tensors (an engine this plumbing does not cover, or capo-verl's
            compat layer not installed in the worker).
        ValueError: invalid ``policy_loss.simko`` parameters.

    Source: CLR-Lab/SimKO@306f4ff4e84ace53e92501939692fcfeb32596b5 ``verl/trainer/ppo/core_algos.py``
    (``compute_policy_loss_simko``); see :mod:`capo_verl.losses.simko` for the differences.
    """
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    inputs = _INPUTS.get()
    if inputs is None:
        from .patching import INSTALL_ERROR as error

        reason = f" (capo_verl.compat failed to install: {error})" if error else ""
        raise _runtime_error(
            "the policy loss was called without the current policy's top-K log-probs, which only capo-verl's "
            f"patch of verl's FSDP engine computes{reason}"
        )
    params = simko_params_of(config)
    topk_log_probs = log_prob.unsqueeze(-1) + inputs.topk_gaps.to(log_prob.dtype)
    terms = simko_terms(log_prob, topk_log_probs, inputs.is_top1, inputs.entropy, advantages, response_mask, params)
    pg_loss, metrics = get_policy_loss_fn("vanilla")(
        old_log_prob=old_log_prob,
        log_prob=terms.log_prob,
        advantages=terms.advantages,
        response_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        config=config,
        rollout_is_weights=rollout_is_weights,
    )
    metrics = dict(metrics)
    metrics.update(simko_diagnostics(terms, topk_log_probs, inputs.is_top1, response_mask))
    return pg_loss, metrics


compute_policy_loss_simko.source = SOURCE


@patch(
    "verl.trainer.ppo.core_algos",
    {"register_policy_loss": ("name",), "get_policy_loss_fn": ("name",), "POLICY_LOSS_REGISTRY": None},
)
def _register_loss(core_algos) -> None:
    """verl/trainer/ppo/core_algos.py: ``register_policy_loss("simko")``."""
    registered = core_algos.POLICY_LOSS_REGISTRY.get(LOSS_MODE)
    if registered is compute_policy_loss_simko:
        return
    if registered is not None:
        raise RuntimeError(f"a policy loss named {LOSS_MODE!r} is already registered with verl: {registered}")
    core_algos.register_policy_loss(LOSS_MODE)(compute_policy_loss_simko)


def install() -> None:
    """Register this module's patches with :func:`capo_verl.compat.after_import` (applied at verl's import)."""
    after_import("verl.workers.config", _patch_policy_loss_config)
    after_import("verl.trainer.ppo.core_algos", _register_loss)
    after_import("verl.workers.utils.losses", _patch_ppo_loss)
    after_import("verl.workers.engine.fsdp.transformer_impl", _patch_engine)


__all__ = [
    "CONFIG_KEY",
    "check_simko_setup",
    "compute_policy_loss_simko",
    "install",
    "local_vocab_size",
    "loss_mode_of",
]
