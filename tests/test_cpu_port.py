"""The CPU port's own doors (``capo_verl/cpu/``): the entry points pyproject.toml declares, vLLM's plugin that records
``/dev/shm`` segments only off an accelerator, and the tiny model's stated size."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

import pytest
import tomllib

import capo_verl.cpu
from capo_verl.compat import host
from capo_verl.cpu import quiet, shm

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_every_entry_point_of_pyproject_names_an_existing_function_or_module():
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    targets = [*project["scripts"].values()]
    for group in project["entry-points"].values():
        targets += group.values()
    assert "capo_verl.cpu:vllm_plugin" in targets and "capo_verl.plugin" in targets
    for target in targets:
        module, _, attr = target.partition(":")
        if module == "capo_verl.plugin":  # importing it installs into verl: its presence is enough here
            assert importlib.util.find_spec(module) is not None
            continue
        loaded = importlib.import_module(module)
        assert not attr or callable(getattr(loaded, attr)), target


@pytest.mark.parametrize(
    ("accelerator", "verl_platform", "records"),
    [(None, None, True), ("cuda", None, False), ("cuda", "cpu", True), (None, "nvidia", False)],
)
def test_vllms_plugin_records_segments_and_quiets_only_where_the_cpu_port_is_installed(
    monkeypatch, accelerator, verl_platform, records
):
    calls = []
    monkeypatch.setattr(host, "torch_accelerator", lambda: accelerator)
    monkeypatch.setattr(shm, "record_created", lambda: calls.append(1))
    monkeypatch.setattr(quiet, "install_filters", lambda: calls.append(2))
    if verl_platform is None:
        monkeypatch.delenv("VERL_PLATFORM", raising=False)
    else:
        monkeypatch.setenv("VERL_PLATFORM", verl_platform)
    capo_verl.cpu.vllm_plugin()
    assert calls == ([1, 2] if records else [])


def test_the_tiny_model_has_the_parameters_its_module_docstring_states(tmp_path):
    from transformers import AutoModelForCausalLM

    from capo_verl.cpu import models

    models.tiny_model_checkpoint(tmp_path)
    count = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(tmp_path).parameters())
    assert count == 394_368
    assert f"({count:,} parameters with the" in models.__doc__
