"""``sdpa`` instead of verl's ``flash_attention_2`` default on a CUDA host without ``flash_attn``
(:mod:`capo_verl.compat.attention`), through the real plugin and verl 0.9.1's real ``HFModelConfig``.

Each host runs in a fresh interpreter, as a Ray worker does: torch's ``cuda.is_available`` reports the simulated
host, ``import verl`` loads capo-verl through its ``verl.plugins`` entry point, and ``HFModelConfig`` is built from
a tiny local checkpoint with verl's ``omega_conf_to_dataclass`` (what ``verl/workers/engine_workers.py`` does).
``flash_attn`` is not installed here; where a case needs it importable, an empty module stands in for it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from capo_verl.compat.attention import INSTALL_COMMAND, KEY

PROBE = textwrap.dedent(
    """
    import json, sys, types
    cuda = sys.argv[1] == "1"
    import torch

    torch.cuda.is_available = lambda: cuda
    torch.cuda.device_count = lambda: int(cuda)
    if not cuda and hasattr(torch, "accelerator"):
        torch.accelerator.current_accelerator = lambda check_available=False: None
    import verl  # loads capo_verl.plugin, as in every process of a run
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import HFModelConfig

    from capo_verl.compat import patching

    def build(typed, flash_attn):
        sys.modules["flash_attn"] = types.ModuleType("flash_attn") if flash_attn else None  # None: import fails
        model = {"path": sys.argv[2]}
        if typed is not None:
            model["override_config"] = {"attn_implementation": typed}
        try:
            cfg = omega_conf_to_dataclass(OmegaConf.create(model), dataclass_type=HFModelConfig)
        except ValueError as exc:
            return {"error": str(exc)}
        return {"attn": cfg.hf_config._attn_implementation, "override": dict(cfg.override_config)}

    cases = {
        "unset": build(None, flash_attn=False),
        "unset_again": build(None, flash_attn=False),
        "typed_flash": build("flash_attention_2", flash_attn=False),
        "typed_eager": build("eager", flash_attn=False),
        "unset_with_flash_attn": build(None, flash_attn=True),
    }
    layers, fn = [], HFModelConfig.__post_init__
    while fn is not None:
        layers.append(fn.__globals__["__name__"])  # the defining module (functools.wraps copies __module__)
        fn = getattr(fn, "__wrapped__", None)
    print(json.dumps({
        "cases": cases,
        "installed": patching.installed_patches(),
        "error": None if patching.INSTALL_ERROR is None else repr(patching.INSTALL_ERROR),
        "post_init_layers": layers,
    }))
    """
)

ATTENTION_PATCH = "capo_verl.compat.attention._patch_model_config"
CPU_PORT_PATCH = "capo_verl.cpu.platform._patch_model_config"


def run_host(cuda: bool, model: str) -> tuple[dict, str]:
    """The probe's result and its log (stderr) on the simulated host (torch sees CUDA or nothing; verl's platform is
    detected as in a run, ``VERL_PLATFORM`` unset)."""
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "VERL_USE_EXTERNAL_PLUGINS")}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, "1" if cuda else "0", model],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd="/",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["error"] is None, result["error"]
    return result, out.stderr


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    from capo_verl.cpu.models import tiny_model_checkpoint

    return str(tiny_model_checkpoint(tmp_path_factory.mktemp("attention") / "tiny_qwen2"))


@pytest.fixture(scope="module")
def cuda_host(tiny_model) -> tuple[dict, str]:
    return run_host(cuda=True, model=tiny_model)


def test_cuda_host_without_flash_attn_builds_the_model_config_with_sdpa_and_says_so_once(cuda_host):
    result, output = cuda_host
    assert ATTENTION_PATCH in result["installed"] and CPU_PORT_PATCH not in result["installed"]
    assert result["post_init_layers"] == ["capo_verl.compat.attention", "verl.workers.config.model"]
    for case in ("unset", "unset_again"):
        assert result["cases"][case] == {"attn": "sdpa", "override": {"attn_implementation": "sdpa"}}
    lines = [line for line in output.splitlines() if f"{KEY}=sdpa" in line]
    assert len(lines) == 1, output[-3000:]  # once per process, however many model configs it builds
    assert INSTALL_COMMAND in lines[0]
    assert "Traceback" not in output


def test_cuda_host_refuses_a_typed_flash_attention_2_without_flash_attn(cuda_host):
    error = cuda_host[0]["cases"]["typed_flash"]["error"]
    assert f"{KEY}=flash_attention_2" in error and INSTALL_COMMAND in error
    assert "\n" not in error


def test_cuda_host_keeps_what_the_user_typed_and_verls_default_where_flash_attn_imports(cuda_host):
    cases = cuda_host[0]["cases"]
    assert cases["typed_eager"] == {"attn": "eager", "override": {"attn_implementation": "eager"}}
    assert cases["unset_with_flash_attn"] == {"attn": "flash_attention_2", "override": {}}


def test_cpu_host_leaves_attention_to_the_cpu_port(tiny_model):
    """Where verl runs on the CPU port's platform, this patch is not installed; the CPU port's own sets ``sdpa`` and
    refuses ``flash_attention_2``, as before (``tests/test_cpu_platform.py``)."""
    result, output = run_host(cuda=False, model=tiny_model)
    assert ATTENTION_PATCH not in result["installed"] and CPU_PORT_PATCH in result["installed"]
    assert result["post_init_layers"] == ["capo_verl.cpu.platform", "verl.workers.config.model"]
    assert result["cases"]["unset"]["attn"] == "sdpa"
    assert "needs a CUDA GPU" in result["cases"]["typed_flash"]["error"]
    assert f"{KEY}=sdpa" not in output
