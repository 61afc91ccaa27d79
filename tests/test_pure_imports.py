"""capo-verl's pure modules import neither verl nor Ray: a fresh interpreter imports them one by one and checks
``sys.modules`` after each; the plugin entry point (which installs into verl) is the control that the check sees
verl."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PURE = [
    "capo_verl",
    "capo_verl.estimators",
    "capo_verl.estimators.common",
    "capo_verl.estimators.capo",
    "capo_verl.estimators.grpo_mask",
    "capo_verl.estimators.codapo",
    "capo_verl.estimators.cde",
    "capo_verl.metrics",
    "capo_verl.losses.simko",
    "capo_verl.reward",
    "capo_verl.evaluation.score",
    "capo_verl.evaluation.problems",
    "capo_verl.evaluation.sampling",
    "capo_verl.cpu.precision",
]

PROBE = textwrap.dedent(
    """
    import importlib, sys
    for name in sys.argv[1:]:
        importlib.import_module(name)
        print(name, *sorted(m for m in ("verl", "ray") if m in sys.modules))
    """
)


def imported_with(modules: list[str]) -> dict[str, list[str]]:
    """``{module: [heavy packages in sys.modules right after importing it]}`` in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", PROBE, *modules], capture_output=True, text=True, timeout=300, cwd="/")
    assert out.returncode == 0, out.stderr[-3000:]
    return {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines()}


def test_pure_modules_import_neither_verl_nor_ray():
    seen = imported_with(PURE)
    assert list(seen) == PURE
    assert {name: heavy for name, heavy in seen.items() if heavy} == {}


def test_the_plugin_entry_point_does_import_verl():
    assert "verl" in imported_with(["capo_verl.plugin"])["capo_verl.plugin"]
