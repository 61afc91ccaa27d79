"""The start report's dtype line (capo_verl/compat/start_report.py) gives the dtypes verl 0.9.1's FSDP engine uses
for the resolved config of the 1.5B CAPO recipe: parameters in ``fsdp_config.model_dtype`` (fp32: verl keeps fp32
master weights), compute in ``fsdp_config.mixed_precision.param_dtype`` (bf16 when unset), for the actor and the
reference model (``verl/workers/engine/fsdp/transformer_impl.py``: ``_build_module``, ``_build_fsdp_module``)."""

from __future__ import annotations

import re

import pytest

pytestmark = [
    pytest.mark.filterwarnings("ignore:Disabled critic as algorithm.adv_estimator:UserWarning"),
    pytest.mark.usefixtures("config_env"),
]

RECIPE = "capo_qwen2.5_math_1.5b"


def report_dtypes(cfg) -> dict[str, tuple[str, str]]:
    """``{role: (params dtype, compute dtype)}`` read off the report's ``dtype:`` line of ``cfg``."""
    from verl.trainer.ppo.utils import need_reference_policy

    from capo_verl.compat.start_report import start_report

    [line] = [ln.strip() for ln in start_report(cfg, need_reference_policy(cfg)).splitlines() if "dtype: " in ln]
    found = re.findall(r"\b(actor|ref) params (\S+) .*?compute (\S+) ", line)
    return {role: (params, compute) for role, params, compute in found}


def verl_dtypes(cfg, role: str) -> tuple[str, str]:
    """What verl's engine reads: ``FSDPEngineConfig.model_dtype`` and ``mixed_precision['param_dtype']`` (bf16
    without it), both as torch dtypes' names through verl's ``PrecisionType``."""
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.torch_dtypes import PrecisionType

    engine = omega_conf_to_dataclass(cfg.actor_rollout_ref[role].fsdp_config)
    compute = (engine.mixed_precision or {}).get("param_dtype", "bf16")
    return PrecisionType.to_dtype(engine.model_dtype), PrecisionType.to_dtype(compute)


def as_dtype(name: str):
    from verl.utils.torch_dtypes import PrecisionType

    return PrecisionType.to_dtype(name)


def test_the_recipe_reports_fp32_parameters_computed_in_bf16_for_actor_and_reference(configs):
    import torch

    cfg = configs.compose(RECIPE)
    got = report_dtypes(cfg)
    assert got == {"actor": ("fp32", "bf16"), "ref": ("fp32", "bf16")}, got
    for role in ("actor", "ref"):
        assert verl_dtypes(cfg, role) == (torch.float32, torch.bfloat16)
        assert tuple(map(as_dtype, got[role])) == verl_dtypes(cfg, role)


def test_overridden_dtypes_are_reported_as_verl_reads_them(configs):
    cfg = configs.compose(
        RECIPE,
        [
            "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32}",
            "actor_rollout_ref.ref.fsdp_config.model_dtype=bf16",
        ],
    )
    got = report_dtypes(cfg)
    assert got == {"actor": ("fp32", "fp32"), "ref": ("bf16", "bf16")}, got
    for role in ("actor", "ref"):
        assert tuple(map(as_dtype, got[role])) == verl_dtypes(cfg, role)
