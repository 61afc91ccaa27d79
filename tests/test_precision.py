"""The CPU configs' compute dtype, chosen by the CPU's flags (capo_verl/cpu/precision.py); no particular machine
needed."""

import logging
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from capo_verl.cpu import precision
from capo_verl.cpu.precision import choose_cpu_dtype, cpu_flags

# flags of real CPUs (abridged /proc/cpuinfo lines)
SAPPHIRE_RAPIDS = "fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8".split()
COOPER_LAKE = "fpu sse2 avx2 avx512f avx512_bf16".split()
GRANITE_AMX_ONLY = "fpu sse2 avx2 amx_bf16".split()  # hypothetical: either flag is enough
EPYC_ROME = "fpu sse2 avx avx2 fma f16c sha_ni".split()  # AVX2 only: bf16 by conversion
SKYLAKE_X = "fpu sse2 avx2 avx512f avx512bw avx512vl avx512_vnni".split()  # AVX-512 without bf16


@pytest.mark.parametrize(
    ("flags", "dtype"),
    [
        (SAPPHIRE_RAPIDS, "bfloat16"),
        (COOPER_LAKE, "bfloat16"),
        (GRANITE_AMX_ONLY, "bfloat16"),
        (EPYC_ROME, "float32"),
        (SKYLAKE_X, "float32"),
        ([], "float32"),
        (None, "float32"),  # unknown (not Linux on x86): float32 is correct everywhere
    ],
)
def test_the_dtype_follows_the_cpu_flags(flags, dtype):
    choice = choose_cpu_dtype(flags)
    assert choice.dtype == dtype
    assert precision.ENV_VAR in choice.reason  # the log line says how to choose otherwise


def test_the_reason_names_the_flags_that_decided():
    assert "avx512_bf16 and amx_bf16" in choose_cpu_dtype(SAPPHIRE_RAPIDS).reason
    assert "neither avx512_bf16 nor amx_bf16" in choose_cpu_dtype(EPYC_ROME).reason
    assert "unknown" in choose_cpu_dtype(None).reason


@pytest.mark.parametrize(
    ("override", "dtype"),
    [("float32", "float32"), ("FP32", "float32"), ("bf16", "bfloat16"), (" bfloat16 ", "bfloat16")],
)
def test_the_environment_variable_wins_over_the_flags(override, dtype):
    for flags in (SAPPHIRE_RAPIDS, EPYC_ROME, None):
        choice = choose_cpu_dtype(flags, override)
        assert choice.dtype == dtype
        assert choice.reason.startswith(f"set by {precision.ENV_VAR}=")


def test_an_empty_environment_variable_is_unset():
    assert choose_cpu_dtype(EPYC_ROME, "").dtype == "float32"
    assert choose_cpu_dtype(SAPPHIRE_RAPIDS, "").dtype == "bfloat16"


def test_an_unknown_override_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"CAPO_VERL_CPU_DTYPE='float16'.*\bCAPO_VERL_CPU_DTYPE=float32\b"):
        choose_cpu_dtype(SAPPHIRE_RAPIDS, "float16")


def test_cpu_flags_reads_the_first_flags_line(tmp_path: Path):
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 fma\n\n"
        "processor\t: 1\nflags\t\t: fpu avx512_bf16\n"
    )
    assert cpu_flags(str(info)) == frozenset({"fpu", "avx2", "fma"})
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")
    assert cpu_flags(str(arm)) is None
    assert cpu_flags(str(tmp_path / "missing")) is None


@pytest.fixture
def cpu(monkeypatch):
    """Set this process's CPU flags and environment override for :func:`precision.cpu_compute_dtype`."""

    def set_cpu(flags, override=None):
        monkeypatch.setattr(precision, "cpu_flags", lambda path="/proc/cpuinfo": flags)
        if override is None:
            monkeypatch.delenv(precision.ENV_VAR, raising=False)
        else:
            monkeypatch.setenv(precision.ENV_VAR, override)
        precision.cpu_compute_dtype.cache_clear()

    yield set_cpu
    precision.cpu_compute_dtype.cache_clear()


def _profile_like():
    """The dtype keys of configs/cpu_base.yaml, as Hydra composes them (interpolations unresolved)."""
    fsdp = {"param_dtype": "${capo_cpu_dtype:fsdp}", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    return OmegaConf.create(
        {
            "actor_rollout_ref": {
                "actor": {"fsdp_config": {"mixed_precision": dict(fsdp), "dtype": "bfloat16"}},
                "ref": {"fsdp_config": {"mixed_precision": dict(fsdp), "optional": None}},
                "rollout": {"dtype": "${capo_cpu_dtype:torch}", "n": 4, "other": "${.n}"},
            }
        }
    )


@pytest.mark.parametrize(
    ("flags", "torch_name", "fsdp_name"), [(SAPPHIRE_RAPIDS, "bfloat16", "bf16"), (EPYC_ROME, "float32", "fp32")]
)
def test_resolve_in_place_sets_every_pass_and_logs_one_line(cpu, caplog, flags, torch_name, fsdp_name):
    cpu(flags)
    config = _profile_like()
    with caplog.at_level(logging.INFO, logger="capo_verl.cpu.precision"):
        resolved = precision.resolve_in_place(config)
    assert sorted(resolved) == [
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype",
        "actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype",
        "actor_rollout_ref.rollout.dtype",
    ]
    arr = config.actor_rollout_ref
    assert arr.rollout.dtype == torch_name
    assert arr.actor.fsdp_config.mixed_precision.param_dtype == fsdp_name
    assert arr.ref.fsdp_config.mixed_precision.param_dtype == fsdp_name
    # plain values now: the run's other processes need no resolver
    assert not OmegaConf.is_interpolation(arr.rollout, "dtype")
    assert OmegaConf.is_interpolation(arr.rollout, "other")  # other interpolations are left alone
    records = [r for r in caplog.records if r.name == "capo_verl.cpu.precision"]
    assert len(records) == 1
    assert records[0].getMessage().startswith(f"compute dtype {torch_name} for ")


def test_a_value_given_for_a_key_wins_and_is_named(cpu, caplog):
    cpu(SAPPHIRE_RAPIDS)
    config = _profile_like()
    config.actor_rollout_ref.rollout.dtype = "float32"  # as the override actor_rollout_ref.rollout.dtype=float32
    with caplog.at_level(logging.INFO, logger="capo_verl.cpu.precision"):
        resolved = precision.resolve_in_place(config)
    assert "actor_rollout_ref.rollout.dtype" not in resolved
    assert config.actor_rollout_ref.rollout.dtype == "float32"
    assert config.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype == "bf16"
    message = caplog.records[-1].getMessage()
    assert "explicitly" in message and "actor_rollout_ref.rollout.dtype=float32" in message, message


def test_the_environment_variable_sets_every_key_without_a_value(cpu):
    cpu(SAPPHIRE_RAPIDS, override="float32")
    config = _profile_like()
    precision.resolve_in_place(config)
    assert config.actor_rollout_ref.rollout.dtype == "float32"
    assert config.actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype == "fp32"


def test_a_config_without_the_resolver_is_left_alone_and_logs_nothing(cpu, caplog):
    cpu(EPYC_ROME)
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"dtype": "bfloat16"}}})
    with caplog.at_level(logging.INFO, logger="capo_verl.cpu.precision"):
        assert precision.resolve_in_place(config) == []
    assert config.actor_rollout_ref.rollout.dtype == "bfloat16"
    assert not [r for r in caplog.records if r.name == "capo_verl.cpu.precision"]


def test_an_unknown_spelling_is_refused(cpu):
    cpu(EPYC_ROME)
    precision.register_resolver()
    config = OmegaConf.create({"x": "${capo_cpu_dtype:megatron}"})
    with pytest.raises(Exception, match=r"'megatron'.*\$\{capo_cpu_dtype:torch\}.*\$\{capo_cpu_dtype:fsdp\}"):
        precision.resolve_in_place(config)


def test_the_cpu_profile_uses_the_resolver_for_every_pass():
    """configs/cpu_base.yaml sets the rollout's and both FSDP passes' dtype through the resolver (read as text:
    composing it needs verl, which the config tests do)."""
    base = OmegaConf.load(Path(__file__).resolve().parents[1] / "configs" / "cpu_base.yaml")
    arr = base.actor_rollout_ref
    assert arr.rollout._get_node("dtype")._value() == "${capo_cpu_dtype:torch}"
    for role in (arr.actor, arr.ref):
        mp = role.fsdp_config.mixed_precision
        assert mp._get_node("param_dtype")._value() == "${capo_cpu_dtype:fsdp}"
        assert (mp.reduce_dtype, mp.buffer_dtype) == ("fp32", "fp32")
