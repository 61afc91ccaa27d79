"""The attention implementation on a CUDA host without FlashAttention-2: ``sdpa`` instead of a crash.

verl 0.9.1 builds every Hugging Face model config with ``attn_implementation`` from the model's ``override_config``,
defaulting to ``flash_attention_2`` (``verl/workers/config/model.py``: ``HFModelConfig.__post_init__``), and the
FSDP engine builds the model from that config (``verl/workers/engine/fsdp/transformer_impl.py``). ``flash_attn`` is
not a dependency of ``verl[vllm]`` (its wheels are built per torch release; verl's install script compiles it), so a
fresh ``pip install -e '.[gpu]'`` has none and each worker would stop in transformers' model construction.

:func:`_patch_model_config` (installed by :func:`capo_verl.compat.install` on every host where the CPU port is not,
i.e. in every process of a GPU run: launcher, TaskRunner, workers, rollout servers) wraps ``__post_init__``. In a
process where torch sees CUDA and ``import flash_attn`` fails:

- ``attn_implementation`` unset: it becomes ``sdpa`` (PyTorch's scaled-dot-product attention), and one line per
  process says so, naming :data:`KEY`, the value set and :data:`INSTALL_COMMAND`;
- ``attn_implementation`` typed as ``flash_attention_2``: refused with a ValueError naming :data:`KEY` and
  :data:`INSTALL_COMMAND`;
- any other typed value is the user's and is kept.

Everywhere else (flash_attn imports, or torch sees no CUDA, e.g. the TaskRunner whose Ray actor has no GPU) the
model config is built as verl builds it. The CPU port's own patch of the same method
(``capo_verl.cpu.platform._patch_model_config``) does the CPU analogue where verl runs on its ``cpu`` platform.
vLLM's rollout picks its own attention kernels and is not affected by this key.
"""

from __future__ import annotations

import functools
import logging
import types

from .patching import after_import, patch

logger = logging.getLogger("capo_verl")

#: the verl config key that chooses the actor's (and reference model's) attention implementation
KEY = "actor_rollout_ref.model.override_config.attn_implementation"

#: how verl 0.9.1's own install script (``scripts/install_vllm_sglang_mcore.sh``) installs FlashAttention-2: built
#: from source against the installed torch (no prebuilt flash-attn wheel matches torch 2.11)
INSTALL_COMMAND = "FLASH_ATTENTION_FORCE_BUILD=TRUE pip install --no-build-isolation flash_attn==2.8.3"

#: the implementation set when flash_attn cannot be imported and the user named none
FALLBACK = "sdpa"

_announced = False


def flash_attn_import_error() -> BaseException | None:
    """The error of ``import flash_attn`` in this process, or None when it imports.

    A missing package raises ModuleNotFoundError; a build for another torch or CUDA raises ImportError (undefined
    symbol) or OSError (a missing shared library). Any of them means transformers cannot run
    ``flash_attention_2`` here.
    """
    try:
        import flash_attn  # noqa: F401
    except Exception as exc:  # noqa: BLE001  every import failure means "not usable"; the error is reported
        return exc
    return None


def cuda_visible() -> bool:
    """Whether torch sees a CUDA device in this process (``torch.cuda.is_available()``); False if that check raises."""
    import torch

    try:
        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001  a broken driver counts as no CUDA, as in capo_verl.compat.host
        return False


def resolve_attn_implementation(override_config: dict | None) -> dict | None:
    """The ``override_config`` that :func:`_patch_model_config` hands to verl, or None to keep the user's.

    Args:
        override_config: ``HFModelConfig.override_config`` (``actor_rollout_ref.model.override_config``), or None.

    Returns:
        ``{**override_config, "attn_implementation": "sdpa"}`` where torch sees CUDA, ``flash_attn`` does not import
        and the user named no implementation (and prints the one line of this module's docstring, once per
        process); None otherwise (nothing to change).

    Raises:
        ValueError: the user typed ``flash_attention_2`` and ``flash_attn`` does not import here; the one-line
            message names :data:`KEY` and :data:`INSTALL_COMMAND`.
    """
    global _announced
    requested = (override_config or {}).get("attn_implementation")
    if requested not in (None, "flash_attention_2") or not cuda_visible():
        return None
    error = flash_attn_import_error()
    if error is None:
        return None
    reason = f"{type(error).__name__}: {error}".splitlines()[0]
    if requested == "flash_attention_2":
        raise ValueError(
            f"{KEY}=flash_attention_2 needs flash_attn, which cannot be imported here ({reason}); install it with "
            f"`{INSTALL_COMMAND}` or set {KEY}={FALLBACK}"
        )
    if not _announced:
        _announced = True
        logger.warning(
            "capo-verl: flash_attn cannot be imported here (%s): set %s=%s (verl's default is flash_attention_2); "
            "for FlashAttention-2 install it with `%s`, or type the key to choose another implementation",
            reason,
            KEY,
            FALLBACK,
            INSTALL_COMMAND,
        )
    return {**(override_config or {}), "attn_implementation": FALLBACK}


@patch("verl.workers.config.model", {"HFModelConfig.__post_init__": ("self",), "HFModelConfig.override_config": None})
def _patch_model_config(module: types.ModuleType) -> None:
    """``verl/workers/config/model.py``: ``HFModelConfig.__post_init__`` resolves ``attn_implementation`` with
    :func:`resolve_attn_implementation` first (``sdpa`` on a CUDA host without flash_attn; a typed
    ``flash_attention_2`` there refused), then runs verl's own."""
    cls = module.HFModelConfig
    original = cls.__post_init__

    @functools.wraps(original)
    def __post_init__(self):
        override = resolve_attn_implementation(self.override_config)
        if override is not None:
            # verl/base_config.py: BaseConfig.__setattr__ refuses to re-assign a field; bypass it here, as the CPU
            # port's patch of this method does.
            object.__setattr__(self, "override_config", override)
        original(self)

    cls.__post_init__ = __post_init__


def install() -> None:
    """Install :func:`_patch_model_config` (right after verl imports ``verl.workers.config.model``, or now)."""
    after_import("verl.workers.config.model", _patch_model_config)
