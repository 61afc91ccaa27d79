"""The ``hf`` rollout server: a Ray actor that generates with a transformers model for verl's agent loop.

verl's agent loop sends one ``generate`` call per response (``verl/workers/rollout/llm_server.py``:
``LLMServerClient.generate`` -> ``server.generate.remote(...)``), concurrently, but spread over tens to hundreds
of milliseconds (each agent loop tokenizes its prompt first). This actor queues them, waits until the burst is
over (no new request for ``COLLECT_QUIET_S``, at most ``COLLECT_MAX_S``), and decodes the whole burst as one
batch (:func:`capo_verl.rollout.sampling.generate_batch`, up to ``rollout.max_num_seqs`` sequences), in a worker
thread so that requests keep arriving meanwhile; requests that arrive during a batch form the next one. A fixed
20 ms window used to split a step's 16 requests into batches of ~7 and ~9, decoded one after the other.

Sampling seeds: every request gets a seed of its own, derived from ``rollout.seed``, the replica's rank, the
trainer step of the current weights, the prompt's token ids and how many requests with the same prompt came before
it at that step (:meth:`HFRolloutServer._request_seed`). A response then depends on those alone, not on how requests
were batched: two runs that validate the same model on the same prompts draw the same samples (up to float
rounding of the batched forward pass), so methods compared from a common start are compared on common random numbers.

Weights: in hybrid mode the trainer's worker of rank 0 of the replica pushes the actor's full HF-named tensors
after every update (:class:`capo_verl.rollout.adapter.HFServerAdapter`, ``update_weights`` here). The model is
created with random weights when ``rollout.load_format`` contains ``dummy`` (verl's default: the first weight
sync happens before the first rollout) and loaded from ``model.path`` otherwise.

Control methods that verl calls (``verl/workers/rollout/replica.py``: ``RolloutReplica``): ``wake_up``/``sleep``
move the model to/from the accelerator when ``rollout.free_cache_engine`` is on (no-op on CPU, where weights
live in host memory anyway); ``abort_all_requests``/``resume_generation`` stop the running batch and gate new
requests; the KV-cache methods are no-ops because the KV cache lives only for the duration of one batch;
profiling is not supported (``start_profile`` raises when the rollout profiler is enabled).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from .sampling import LOGPROBS_MODES, SampleOutput, SamplingSpec, generate_batch

logger = logging.getLogger("capo_verl.rollout")
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "WARN"))

#: the batcher starts a batch once no new request has arrived for this many seconds (a burst has ended) ...
COLLECT_QUIET_S = 0.1
#: ... or this many seconds after the first queued request, or as soon as ``rollout.max_num_seqs`` are queued
COLLECT_MAX_S = 2.0

#: sampling-parameter keys a request may carry (what verl's agent loops send); anything else is an error
KNOWN_SAMPLING_KEYS = frozenset(
    {
        "temperature",
        "top_p",
        "top_k",
        "repetition_penalty",
        "logprobs",
        "max_tokens",
        "max_new_tokens",
        "ignore_eos",
        "stop_token_ids",
    }
)


@dataclass
class _Request:
    request_id: str
    prompt_ids: list[int]
    spec: SamplingSpec
    want_log_probs: bool
    seed: int
    future: asyncio.Future = field(repr=False, default=None)


def resolve_device(device_id: Optional[str]) -> torch.device:
    """The torch device of the server: ``cpu`` on verl's CPU platform, else the accelerator the worker holds.

    Args:
        device_id: the Ray accelerator id of the replica's first worker (``get_accelerator_ids()``), or None.
            With ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES`` the server sees the node's devices; the id is
            mapped through ``CUDA_VISIBLE_DEVICES`` when that is set.
    """
    from verl.utils.device import get_device_name, get_visible_devices_keyword

    name = get_device_name()
    if name == "cpu":
        return torch.device("cpu")
    index = 0
    if device_id is not None:
        visible = os.environ.get(get_visible_devices_keyword())
        ids = [v.strip() for v in visible.split(",")] if visible else None
        index = ids.index(str(device_id)) if ids and str(device_id) in ids else int(device_id)
    return torch.device(name, index)


class HFRolloutServer:
    """Token-in/token-out generation server for one rollout replica (use through ``ray.remote``).

    Args:
        config: ``RolloutConfig`` (``actor_rollout_ref.rollout``) as a dataclass.
        model_config: ``actor_rollout_ref.model`` (DictConfig or ``HFModelConfig``).
        rollout_mode: verl's ``RolloutMode`` (only ``HYBRID`` is launched by :class:`HFReplica`).
        replica_rank: index of the replica.
        device_id: accelerator id of the replica's worker (None on CPU).
    """

    def __init__(self, config, model_config, rollout_mode, replica_rank: int, device_id: Optional[str] = None):
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.config import HFModelConfig

        self.config = config
        self.model_config = (
            model_config
            if isinstance(model_config, HFModelConfig)
            else omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        )
        self.rollout_mode = rollout_mode
        self.replica_rank = replica_rank
        self.global_steps = None
        self.device = resolve_device(device_id)
        if self.device.type == "cpu":
            # Ray starts actors with OMP_NUM_THREADS=1; in hybrid mode the trainer idles while we generate.
            torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))
        if config.full_determinism:
            raise ValueError(
                "actor_rollout_ref.rollout.full_determinism=True is not supported by the hf rollout "
                "(requests are seeded, but the batched forward pass rounds differently in different batches); "
                "set it to False"
            )
        if config.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(
                f"actor_rollout_ref.rollout.logprobs_mode={config.logprobs_mode!r} is not supported by the hf "
                f"rollout; use one of {LOGPROBS_MODES}"
            )
        self.model = self._load_model()
        self._on_device = True
        self._synced_names: set[str] = set()

        tokenizer = self.model_config.tokenizer
        eos = self.model_config.generation_config.eos_token_id if self.model_config.generation_config else None
        eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
        if tokenizer is not None and tokenizer.eos_token_id is not None:
            eos_ids.add(tokenizer.eos_token_id)
        if not eos_ids:
            raise ValueError(
                f"no EOS token id for {self.model_config.path}: neither generation_config.json nor the tokenizer "
                "names one; add eos_token_id to the model's generation_config.json"
            )
        self.eos_token_ids = sorted(int(t) for t in eos_ids)
        pad = tokenizer.pad_token_id if tokenizer is not None else None
        self.pad_token_id = int(pad) if pad is not None else self.eos_token_ids[0]

        from verl.workers.rollout.utils import get_max_position_embeddings

        max_pos = get_max_position_embeddings(self.model_config.hf_config)
        self.max_model_len = int(config.max_model_len or max_pos)
        if self.max_model_len > max_pos:
            raise ValueError(
                f"actor_rollout_ref.rollout.max_model_len={self.max_model_len} exceeds the model's "
                f"max_position_embeddings={max_pos}; lower it or leave it null"
            )
        self.max_batch = max(1, int(config.max_num_seqs))

        self._seed_base = f"{int(config.seed)}|{int(replica_rank)}"
        self._seed_step: Optional[int] = None  # trainer step that _prompt_counts belongs to
        self._prompt_counts: dict[bytes, int] = {}
        self._pending: list[_Request] = []
        self._wakeup: asyncio.Event | None = None
        self._batcher: asyncio.Task | None = None
        self._lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.batch_running = False
        self._abort = False
        self._paused = False
        self._rejecting = False
        self._resume: asyncio.Event | None = None
        self.stats = {"batches": 0, "sequences": 0, "tokens": 0, "generate_s": 0.0, "max_batch": 0}

    # ------------------------------------------------------------------ model
    def _load_model(self) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM
        from verl.utils.torch_dtypes import PrecisionType

        dtype = PrecisionType.to_dtype(self.config.dtype)
        hf_config = self.model_config.hf_config
        kwargs = dict(dtype=dtype, trust_remote_code=self.model_config.trust_remote_code)
        if "dummy" in str(self.config.load_format):
            model = AutoModelForCausalLM.from_config(hf_config, **kwargs)
        else:
            model = AutoModelForCausalLM.from_pretrained(self.model_config.local_path, config=hf_config, **kwargs)
        return model.to(self.device).eval()

    def _expected_names(self) -> dict[str, torch.Tensor]:
        return dict(self.model.state_dict(keep_vars=True))

    async def update_weights(self, named_tensors, global_steps: Optional[int] = None) -> dict[str, Any]:
        """Copy the actor's weights into the model (waits for a running batch first).

        Args:
            named_tensors: dict ``{hf_name: tensor}`` or list of ``(hf_name, tensor)``: full (unsharded) tensors,
                any dtype/device; copied and cast into the model's parameters and buffers.
            global_steps: the trainer step these weights belong to (reported back as ``global_steps``).

        Returns:
            ``{"tensors": n, "seconds": s}``.

        Raises:
            KeyError: a name the model does not have (the actor and rollout models differ).
            RuntimeError: after the first sync, some parameters never received weights.
        """
        items = named_tensors.items() if isinstance(named_tensors, dict) else named_tensors
        await self._ensure_loop_objects()
        t0 = time.time()
        async with self._lock:
            targets = self._expected_names()
            count = 0
            with torch.no_grad():
                for name, tensor in items:
                    target = targets.get(name)
                    if target is None:
                        raise KeyError(
                            f"hf rollout: the actor sent weight {name!r}, which the rollout model "
                            f"{type(self.model).__name__} does not have"
                        )
                    target.data.copy_(tensor.to(device=target.device, dtype=target.dtype))
                    self._synced_names.add(name)
                    count += 1
            self._check_complete(targets)
        if global_steps is not None:
            self.global_steps = global_steps
        return {"tensors": count, "seconds": time.time() - t0}

    def _check_complete(self, targets: dict[str, torch.Tensor]) -> None:
        synced_ptrs = {targets[n].data_ptr() for n in self._synced_names}
        params = dict(self.model.named_parameters(remove_duplicate=False))
        missing = [n for n, p in params.items() if n not in self._synced_names and p.data_ptr() not in synced_ptrs]
        if missing:
            raise RuntimeError(
                f"hf rollout: the weight sync did not cover {len(missing)} parameters of the rollout model "
                f"(e.g. {missing[:3]}); the rollout would sample from stale weights"
            )

    async def set_global_steps(self, global_steps: int) -> None:
        """Record the trainer step of the current weights."""
        self.global_steps = global_steps

    # ------------------------------------------------------------- generation
    async def _ensure_loop_objects(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # first call (Ray's actor loop), or a new loop when driven without Ray
            self._loop = loop
            self._lock = asyncio.Lock()
            self._wakeup = asyncio.Event()
            self._resume = asyncio.Event()
            self._resume.set()
            self._batcher = None
        if self._batcher is None or self._batcher.done():
            self._batcher = asyncio.get_running_loop().create_task(self._batch_loop())

    def _spec(self, prompt_len: int, sampling_params: dict[str, Any]) -> tuple[SamplingSpec, bool]:
        params = dict(sampling_params)
        unknown = set(params) - KNOWN_SAMPLING_KEYS
        if unknown:
            raise ValueError(
                f"hf rollout: unsupported sampling parameters {sorted(unknown)}; "
                f"supported: {sorted(KNOWN_SAMPLING_KEYS)}"
            )
        headroom = self.max_model_len - prompt_len
        if headroom < 1:
            raise ValueError(
                f"Prompt length ({prompt_len}) leaves no room to generate within the model's maximum context "
                f"length ({self.max_model_len}); lower data.max_prompt_length or filter long prompts"
            )
        if "max_tokens" in params:
            max_tokens = params.pop("max_tokens")
        elif "max_new_tokens" in params:
            max_tokens = params.pop("max_new_tokens")
        else:  # same rule as verl's vLLM server (vllm_async_server.py: generate)
            max_tokens = min(
                self.config.response_length, self.config.prompt_length + self.config.response_length - prompt_len
            )
        max_tokens = max(1, min(int(max_tokens), headroom))
        top_k = params.get("top_k", -1)
        spec = SamplingSpec(
            max_tokens=max_tokens,
            temperature=float(params.get("temperature", 1.0)),
            top_k=-1 if top_k is None else int(top_k),
            top_p=float(params.get("top_p", 1.0)),
            repetition_penalty=float(params.get("repetition_penalty", self.config.get("repetition_penalty", 1.0))),
            stop_token_ids=tuple(int(t) for t in (params.get("stop_token_ids") or ())),
            ignore_eos=bool(params.get("ignore_eos", self.config.ignore_eos)),
        )
        return spec, bool(params.get("logprobs", False))

    def _request_seed(self, prompt_ids: list[int]) -> int:
        """The sampling seed of a new request: a 63-bit hash of (``rollout.seed``, replica rank, trainer step of
        the weights, prompt token ids, number of earlier requests with this prompt at this step)."""
        if self.global_steps != self._seed_step:
            self._seed_step, self._prompt_counts = self.global_steps, {}
        prompt_key = hashlib.sha256(",".join(map(str, prompt_ids)).encode()).digest()
        occurrence = self._prompt_counts.get(prompt_key, 0)
        self._prompt_counts[prompt_key] = occurrence + 1
        text = f"{self._seed_base}|{self.global_steps}|{prompt_key.hex()}|{occurrence}"
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") & (2**63 - 1)

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Optional[list[Any]] = None,
        video_data: Optional[list[Any]] = None,
        audio_data: Optional[list[Any]] = None,
        mm_processor_kwargs: Optional[dict[str, Any]] = None,
        priority: int = 0,
        **kwargs: Any,
    ):
        """Generate one response (verl's server interface, ``verl/workers/rollout/replica.py``).

        Args:
            prompt_ids: prompt token ids.
            sampling_params: ``temperature`` (0 = greedy), ``top_p``, ``top_k`` (-1 = off),
                ``repetition_penalty``, ``logprobs`` (bool), optional ``max_tokens``/``max_new_tokens``,
                ``ignore_eos``, ``stop_token_ids``.
            request_id: caller's id (used in logs).
            image_data, video_data, audio_data, mm_processor_kwargs: must be empty (text-only backend).
            priority: ignored (requests are batched first-come, first-served).

        Returns:
            ``TokenOutput``: ``token_ids`` (response only, stop token included), ``log_probs`` (one float per token,
            see :mod:`capo_verl.rollout.sampling`) when ``logprobs`` was asked, ``stop_reason`` ``"completed"``
            or ``"aborted"``, ``extra_fields={"global_steps": <step of the weights>}``.

        Raises:
            NotImplementedError: multimodal input.
            ValueError: unsupported sampling parameter, prompt too long for the model.
        """
        from verl.utils import normalize_token_ids
        from verl.workers.rollout.replica import TokenOutput

        if image_data or video_data or audio_data or mm_processor_kwargs:
            raise NotImplementedError("the hf rollout is text-only; use rollout.name=vllm for multimodal models")
        if kwargs:
            logger.debug("hf rollout ignores generate kwargs %s", sorted(kwargs))
        prompt_ids = list(normalize_token_ids(prompt_ids))
        spec, want_lp = self._spec(len(prompt_ids), sampling_params)
        await self._ensure_loop_objects()
        if self._paused:
            if self._rejecting:
                extra = {"global_steps": self.global_steps}
                return TokenOutput(token_ids=[], stop_reason="aborted", extra_fields=extra)
            await self._resume.wait()
        seed = self._request_seed(prompt_ids)
        request = _Request(request_id, prompt_ids, spec, want_lp, seed, asyncio.get_running_loop().create_future())
        self._pending.append(request)
        self._wakeup.set()
        out: SampleOutput = await request.future
        return TokenOutput(
            token_ids=out.token_ids,
            log_probs=out.log_probs if want_lp else None,
            stop_reason="aborted" if out.finish_reason == "abort" else "completed",
            extra_fields={"global_steps": self.global_steps},
        )

    async def _batch_loop(self) -> None:
        while True:
            await self._wakeup.wait()
            await self._collect_burst()
            self._wakeup.clear()
            batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
            if self._pending:
                self._wakeup.set()
            if not batch:
                continue
            async with self._lock:
                try:
                    outs = await asyncio.to_thread(self._run_batch, batch)
                except BaseException as exc:  # hand the error to every waiting request
                    for req in batch:
                        if not req.future.done():
                            req.future.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
                    continue
            for req, out in zip(batch, outs):
                if not req.future.done():
                    req.future.set_result(out)

    async def _collect_burst(self) -> None:
        """Wait while requests keep arriving: until none came for COLLECT_QUIET_S, COLLECT_MAX_S have passed
        since this call, or ``max_num_seqs`` requests are queued."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + COLLECT_MAX_S
        seen = -1
        while len(self._pending) != seen and len(self._pending) < self.max_batch:
            seen = len(self._pending)
            wait = min(COLLECT_QUIET_S, deadline - loop.time())
            if wait <= 0:
                break
            await asyncio.sleep(wait)

    def _run_batch(self, batch: list[_Request]) -> list[SampleOutput]:
        if not self._on_device:
            raise RuntimeError("hf rollout: generate called while the server sleeps (weights offloaded)")
        t0 = time.time()
        self.batch_running = True
        try:
            outs = self._decode(batch)
        finally:
            self.batch_running = False
        seconds, tokens = time.time() - t0, sum(len(o.token_ids) for o in outs)
        self.stats["batches"] += 1
        self.stats["sequences"] += len(batch)
        self.stats["tokens"] += tokens
        self.stats["generate_s"] += seconds
        self.stats["max_batch"] = max(self.stats["max_batch"], len(batch))
        logger.info("hf rollout: %d sequences, %d tokens in %.2f s (%.1f tokens/s)", len(batch), tokens, seconds,
                    tokens / max(seconds, 1e-9))
        return outs

    def _decode(self, batch: list[_Request]) -> list[SampleOutput]:
        return generate_batch(
            self.model,
            [r.prompt_ids for r in batch],
            [r.spec for r in batch],
            eos_token_ids=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            want_log_probs=[r.want_log_probs for r in batch],
            logprobs_mode=self.config.logprobs_mode,
            seeds=[r.seed for r in batch],
            should_abort=lambda: self._abort,
        )

    async def get_stats(self) -> dict[str, Any]:
        """Counters: batches, sequences, tokens generated, seconds in generation, largest batch."""
        return dict(self.stats)

    # --------------------------------------------------------- control methods
    async def wake_up(self, tags: Optional[list[str]] = None) -> None:
        """Move the weights back to the accelerator (tags ``weights``/None); ``kv_cache``: nothing to restore."""
        if tags is not None and "weights" not in tags:
            return
        if not self._on_device:
            self.model.to(self.device)
            self._on_device = True

    async def sleep(self) -> None:
        """Hybrid mode with ``free_cache_engine``: offload the weights to host memory (no-op on CPU)."""
        from verl.workers.rollout.replica import RolloutMode

        if not self.config.free_cache_engine or self.rollout_mode != RolloutMode.HYBRID:
            return
        if self.device.type != "cpu":
            await self._ensure_loop_objects()
            async with self._lock:
                self.model.to("cpu")
                self._on_device = False
                from verl.utils.device import get_torch_device

                get_torch_device().empty_cache()

    async def abort_all_requests(self, reject_request: bool = False, **kwargs) -> dict[str, Any]:
        """Stop the running batch and answer every queued request with ``stop_reason="aborted"``.

        New requests wait until :meth:`resume_generation`, or are answered ``aborted`` at once when
        ``reject_request`` is True.
        """
        await self._ensure_loop_objects()
        self._paused = True
        self._rejecting = bool(reject_request)
        self._resume.clear()
        self._abort = True
        queued, self._pending = self._pending, []
        for req in queued:
            if not req.future.done():
                req.future.set_result(SampleOutput(finish_reason="abort"))
        async with self._lock:  # the running batch returns its partial outputs as aborted
            pass
        self._abort = False
        return {"aborted_count": len(queued), "request_ids": [r.request_id for r in queued]}

    async def resume_generation(self) -> None:
        """Admit requests again after :meth:`abort_all_requests`."""
        await self._ensure_loop_objects()
        self._paused = False
        self._rejecting = False
        self._resume.set()

    async def clear_kv_cache(self) -> None:
        """No-op: the KV cache lives only while a batch is decoded."""

    async def release_kv_cache(self) -> None:
        """No-op: the KV cache lives only while a batch is decoded."""

    async def resume_kv_cache(self) -> None:
        """No-op: the KV cache lives only while a batch is decoded."""

    async def start_profile(self, **kwargs) -> None:
        """Profiling of the hf rollout is not supported: raise if the rollout profiler is enabled."""
        profiler = getattr(self.config, "profiler", None)
        if profiler is not None and getattr(profiler, "enable", False):
            raise NotImplementedError(
                "actor_rollout_ref.rollout.profiler.enable=True is not supported by the hf rollout; disable it"
            )

    async def stop_profile(self) -> None:
        """See :meth:`start_profile`."""
