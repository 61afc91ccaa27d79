"""Whether this host needs capo-verl's CPU port (:mod:`capo_verl.cpu`): the one question
:func:`capo_verl.compat.install` asks before it installs it.

verl 0.9.1 resolves one platform per process (``verl/plugin/platform/platform_manager.py``:
``_detect_platform_name``): ``VERL_PLATFORM`` when set, else the first registered platform (``nvidia``, ``npu``,
``rocm``, a plugin's) whose ``is_platform_available(use_smi_check=True)`` is true, else ``nvidia``. The CPU port's
``cpu`` platform is registered after verl's own and claims the host only when none of them does *and* torch sees
no accelerator (verl's ``nvidia`` check answers False without the ``nvidia-smi`` binary even with a working CUDA).
:func:`cpu_port_needed` asks the same questions without resolving verl's platform (that happens once per process,
and must happen after the ``cpu`` platform is registered), so the CPU port is installed exactly where verl then
resolves ``cpu``:

- ``VERL_PLATFORM=cpu``: needed; ``VERL_PLATFORM`` set to anything else: not needed (verl uses that platform);
- torch sees an accelerator (:func:`torch_accelerator`): not needed;
- a registered verl platform other than ``cpu`` claims the host (:func:`claimed_by`; e.g. a CPU-only Ray actor on a
  GPU node, where ``CUDA_VISIBLE_DEVICES`` is empty and verl's ``nvidia`` check finds ``nvidia-smi``): not needed;
- else (no accelerator at all): needed.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("capo_verl.compat.host")

#: the name of the CPU port's verl platform (``VERL_PLATFORM=cpu`` asks for it)
CPU_PLATFORM = "cpu"


def torch_accelerator() -> str | None:
    """The name of an accelerator that torch can use in this process (``cuda``, ``xpu``, ...), or None.

    Asks ``torch.cuda.is_available()``, then ``torch.accelerator.current_accelerator()`` (torch >= 2.6), then
    ``torch.xpu`` and ``torch.npu`` (the latter exists once ``torch_npu`` is imported) where present. A check that
    raises counts as "not available" for that API only, with a warning that names the check and the error.
    """
    import torch

    checks = [("cuda", lambda: torch.cuda.is_available())]
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "current_accelerator"):

        def current() -> bool:
            device = accelerator.current_accelerator(check_available=True)
            return device is not None and device.type != "cpu"

        checks.append(("accelerator", current))
    for name in ("xpu", "npu"):
        module = getattr(torch, name, None)
        if module is not None and hasattr(module, "is_available"):
            checks.append((name, module.is_available))
    for name, check in checks:
        try:
            if check():
                if name == "accelerator":
                    return accelerator.current_accelerator().type
                return name
        except Exception as exc:  # noqa: BLE001  any failure of a probe: logged, that API counts as unavailable
            logger.warning(
                "accelerator check torch.%s raised %s: %s; counted as no accelerator of that kind (a broken driver "
                "or torch build?)",
                "accelerator.current_accelerator()" if name == "accelerator" else f"{name}.is_available()",
                type(exc).__name__,
                exc,
            )
            continue
    return None


def claimed_by(registry, use_smi_check: bool = True) -> str | None:
    """The name of a registered verl platform other than ``cpu`` (nvidia, npu, rocm, a plugin's) that claims this
    host, whatever the registration order; None when none does.

    Args:
        registry: verl's ``verl.plugin.platform.PlatformRegistry`` (or an object with its ``registered_names()`` and
            ``get(name)``).
        use_smi_check: passed to each platform's ``is_platform_available``; verl's detection passes True.

    A platform whose availability check raises counts as not claiming the host, as in verl's own detection loop
    (``platform_manager._detect_platform_name``); the error is logged at DEBUG level, as verl does.
    """
    for name in registry.registered_names():
        cls = registry.get(name)
        if name == CPU_PLATFORM or cls is None:
            continue
        try:
            if cls().is_platform_available(use_smi_check=use_smi_check):
                return name
        except Exception as exc:  # noqa: BLE001  any failure of another platform's probe: not that platform
            logger.debug(
                "platform %r's availability check raised %s: %s; counted as not available, as verl's detection does",
                name,
                type(exc).__name__,
                exc,
            )
    return None


def cpu_port_needed(probe_verl: bool = True) -> bool:
    """True where verl resolves (or will resolve) the CPU port's ``cpu`` platform (see the module docstring).

    Args:
        probe_verl: also ask verl's registered platforms (:func:`claimed_by` on ``verl.plugin.platform``'s
            ``PlatformRegistry``, which imports verl). False where verl must not be imported for this question
            (vLLM's processes, which see the devices they run on): then ``VERL_PLATFORM`` and torch decide.

    Raises nothing: a probe that fails counts as "not that accelerator" and is logged (:func:`torch_accelerator`,
    :func:`claimed_by`).
    """
    requested = os.environ.get("VERL_PLATFORM", "").strip().lower()
    if requested:
        return requested == CPU_PLATFORM
    if torch_accelerator() is not None:
        return False
    if not probe_verl:
        return True
    from verl.plugin.platform import PlatformRegistry

    return claimed_by(PlatformRegistry, use_smi_check=True) is None
