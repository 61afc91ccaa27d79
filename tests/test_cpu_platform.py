"""The CPU platform that lets verl's trainer run without an accelerator.

Real verl objects only: the platform registry, the FSDP engine registry, ``HFModelConfig``, verl's process-group
helper and flops counter. The tests that need "no accelerator" skip on a machine that has one.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import pytest
import torch

import capo_verl.plugin  # noqa: F401  (the plugin, as verl loads it)

needs_no_accelerator = pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is present: verl uses it")


@needs_no_accelerator
def test_verl_resolves_the_cpu_platform():
    from verl.plugin.platform import get_platform
    from verl.utils.device import get_device_id, get_device_name, get_nccl_backend, get_torch_device

    platform = get_platform()
    assert platform.device_name == get_device_name() == "cpu"
    assert get_nccl_backend() == "gloo"
    assert torch.zeros(1).to(get_device_id()).device.type == "cpu"  # verl passes it to torch as a device
    module = get_torch_device()
    free, total = module.mem_get_info()
    assert 0 < free <= total
    assert module.memory_allocated() == 0 and module.get_device_name() == "CPU"
    module.empty_cache()
    module.set_rng_state(module.get_rng_state())


@needs_no_accelerator
def test_flops_counter_knows_the_cpu():
    from verl.utils.flops_counter import get_device_flops

    assert get_device_flops() == pytest.approx(0.448)  # verl's _DEVICE_FLOPS["CPU"] in TFLOPS


def test_cpu_platform_is_not_picked_when_an_accelerator_platform_is_available():
    from verl.plugin.platform import PlatformRegistry

    cpu = PlatformRegistry.get("cpu")()
    others = [
        PlatformRegistry.get(n)().is_platform_available(use_smi_check=True)
        for n in PlatformRegistry.registered_names()
        if n != "cpu"
    ]
    assert cpu.is_platform_available(use_smi_check=True) == (not any(others))
    assert list(PlatformRegistry.registered_names())[-1] == "cpu"  # tried after verl's own platforms


@needs_no_accelerator
def test_fsdp_engine_is_registered_for_cpu_and_ref_offload_does_not_pin():
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp import transformer_impl

    assert EngineRegistry.get_engine_cls("language_model", "fsdp2") is transformer_impl.FSDPEngineWithLMHead
    assert EngineRegistry.get_engine_cls("value_model", "fsdp2") is transformer_impl.FSDPEngineWithValueHead
    policy = transformer_impl.CPUOffloadPolicy(pin_memory=True)
    assert policy.pin_memory is False
    from torch.distributed.fsdp import CPUOffloadPolicy

    assert isinstance(policy, CPUOffloadPolicy)


@needs_no_accelerator
def test_replay_buffer_polls_often_on_cpu_and_keeps_an_explicit_interval():
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    from capo_verl.cpu.platform import CPU_POLL_INTERVAL_S

    kw = dict(
        trainer_mode="sync",
        trainer_config=OmegaConf.create({}),
        max_off_policy_threshold=None,
        max_off_policy_strategy="drop",
        sampler_kwargs=OmegaConf.create({}),
    )
    assert ReplayBuffer(**kw).poll_interval == CPU_POLL_INTERVAL_S < 2.0
    assert ReplayBuffer(**kw, poll_interval=1.5).poll_interval == 1.5
    assert ReplayBuffer.__init__.__wrapped__.__module__ == "verl.trainer.ppo.v1.replay_buffer"


@needs_no_accelerator
def test_attention_defaults_to_sdpa_and_flash_attention_is_refused(tmp_path):
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import HFModelConfig

    from capo_verl.cpu.models import tiny_model_checkpoint

    path = tiny_model_checkpoint(tmp_path / "tiny")
    cfg = omega_conf_to_dataclass(OmegaConf.create({"path": str(path)}), dataclass_type=HFModelConfig)
    assert cfg.hf_config._attn_implementation == "sdpa"
    eager = omega_conf_to_dataclass(
        OmegaConf.create({"path": str(path), "override_config": {"attn_implementation": "eager"}}),
        dataclass_type=HFModelConfig,
    )
    assert eager.hf_config._attn_implementation == "eager"
    with pytest.raises(ValueError, match="override_config.attn_implementation=flash_attention_2"):
        omega_conf_to_dataclass(
            OmegaConf.create({"path": str(path), "override_config": {"attn_implementation": "flash_attention_2"}}),
            dataclass_type=HFModelConfig,
        )


@needs_no_accelerator
def test_verl_process_group_helper_uses_gloo_in_a_fresh_process():
    """``initialize_global_process_group_ray`` (what every verl worker calls) works with 2 ranks on CPU."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = textwrap.dedent(
        """
        import os, torch, torch.distributed as dist, verl
        from verl.utils.distributed import initialize_global_process_group_ray
        initialize_global_process_group_ray(timeout_second=60)
        t = torch.tensor([float(os.environ["RANK"]) + 1])
        dist.all_reduce(t)
        print(dist.get_backend(), t.item())
        dist.destroy_process_group()
        """
    )
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    outs = [p.communicate(timeout=180) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
        assert out.strip().splitlines()[-1] == "gloo 3.0"


@needs_no_accelerator
@pytest.mark.parametrize("world_size", [1, 2])
def test_a_taken_master_port_is_replaced_for_one_rank_and_raised_for_more(world_size):
    """Another process took ``MASTER_PORT`` between verl picking it and rank 0 binding it (a shared machine)."""
    code = textwrap.dedent(
        """
        import os, socket, torch, torch.distributed as dist, verl
        from verl.utils.distributed import initialize_global_process_group_ray
        holder = socket.socket()
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        os.environ["MASTER_PORT"] = taken = str(holder.getsockname()[1])
        try:
            initialize_global_process_group_ray(timeout_second=20)
        except dist.DistNetworkError as err:
            n = err.__notes__[-1]
            print("raised", "EADDRINUSE" in str(err), os.environ["MASTER_PORT"] == taken, "launch the run again" in n)
        else:
            t = torch.ones(1)
            dist.all_reduce(t)
            print("joined", dist.get_backend(), t.item(), os.environ["MASTER_PORT"] != taken)
            dist.destroy_process_group()
        """
    )
    env = dict(os.environ, RANK="0", WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-2000:]
    if world_size == 1:
        assert run.stdout.split() == ["joined", "gloo", "1.0", "True"]
        assert "was taken by another process after verl picked it; retrying on port" in run.stderr
    else:  # rank 1 would still dial the old port
        assert run.stdout.split() == ["raised", "True", "True", "True"]


@pytest.mark.parametrize("api", ["cuda", "accelerator"])
def test_a_host_where_torch_sees_an_accelerator_is_not_claimed_without_nvidia_smi(tmp_path, api):
    # verl's nvidia check needs the nvidia-smi binary (PATH or /usr/bin, /usr/local/bin, /usr/local/cuda/bin):
    # without it, a CUDA container must fall back to nvidia as with verl alone, not to the cpu platform. The plugin
    # does not install the CPU port there; and the cpu platform, registered by hand, declines the host too.
    for path in ("/usr/bin/nvidia-smi", "/usr/local/bin/nvidia-smi", "/usr/local/cuda/bin/nvidia-smi"):
        if os.path.exists(path):
            pytest.skip(f"{path} exists on this host")
    fake = {
        "cuda": "torch.cuda.is_available = lambda: True",
        "accelerator": "torch.accelerator.current_accelerator = lambda check_available=False: torch.device('xpu')",
    }[api]
    code = textwrap.dedent(
        f"""
        import torch
        {fake}
        import verl  # loads the plugin
        from verl.plugin.platform import PlatformRegistry
        from verl.plugin.platform.platform_manager import _detect_platform_name
        from capo_verl.compat.host import torch_accelerator
        registered = "cpu" in PlatformRegistry.registered_names()
        import capo_verl.cpu
        capo_verl.cpu.install()
        print(torch_accelerator(), registered, PlatformRegistry.get("cpu")().is_platform_available(use_smi_check=True),
              _detect_platform_name())
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    env["PATH"] = str(tmp_path)  # no nvidia-smi
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    name = {"cuda": "cuda", "accelerator": "xpu"}[api]
    assert out.stdout.split() == [name, "False", "False", "nvidia"]


@needs_no_accelerator
def test_torch_sees_no_accelerator_here_and_the_cpu_platform_claims_the_host():
    from verl.plugin.platform import PlatformRegistry

    from capo_verl.compat.host import torch_accelerator

    assert torch_accelerator() is None
    assert PlatformRegistry.get("cpu")().is_platform_available(use_smi_check=True)


def test_a_probe_that_raises_counts_as_no_accelerator_and_is_logged(monkeypatch, caplog):
    """A broken accelerator check (e.g. a driver error inside torch.cuda.is_available) does not silently decide the
    platform: it is logged with the check's name and the error."""
    import logging

    import torch

    from capo_verl.compat.host import torch_accelerator

    def broken():
        raise RuntimeError("driver init failed")

    monkeypatch.setattr(torch.cuda, "is_available", broken)
    with caplog.at_level(logging.WARNING, logger="capo_verl.compat.host"):
        torch_accelerator()
    [record] = [r for r in caplog.records if "torch.cuda.is_available()" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "RuntimeError: driver init failed" in record.getMessage()


def test_another_platforms_failing_check_is_logged_and_does_not_claim_the_host(caplog):
    """As verl's own detection loop: a platform whose availability check raises does not claim the host; the error
    is logged at DEBUG level with the platform's name and the reason."""
    import logging
    import types

    from capo_verl.compat.host import CPU_PLATFORM, claimed_by

    class Broken:
        def is_platform_available(self, use_smi_check=False):
            raise OSError("driver gone")

    class Present:
        def is_platform_available(self, use_smi_check=False):
            return True

    platforms = {CPU_PLATFORM: Present, "broken": Broken}
    registry = types.SimpleNamespace(registered_names=lambda: tuple(platforms), get=platforms.get)
    with caplog.at_level(logging.DEBUG, logger="capo_verl.compat.host"):
        assert claimed_by(registry, use_smi_check=True) is None  # the cpu platform itself is never counted
    assert "platform 'broken'" in caplog.text and "OSError: driver gone" in caplog.text
    platforms["present"] = Present
    assert claimed_by(registry, use_smi_check=True) == "present"


def test_a_platform_base_with_an_abstract_method_the_cpu_platform_lacks_is_refused():
    """verl's detection swallows the TypeError of an abstract class and would fall back to nvidia without a word."""
    import abc
    import types

    from verl.plugin import platform

    from capo_verl.cpu.platform import _register_platform

    class PlatformBase(platform.PlatformBase):
        @abc.abstractmethod
        def new_query(self) -> int: ...

    stand_in = types.SimpleNamespace(
        PlatformBase=PlatformBase, PlatformRegistry=platform.PlatformRegistry, get_platform=platform.get_platform
    )
    before = platform.PlatformRegistry.get("cpu")
    with pytest.raises(RuntimeError, match=r"PlatformBase\b.*verl 0\.9\.1.*\['new_query'\]"):
        _register_platform(stand_in)
    assert platform.PlatformRegistry.get("cpu") is before
