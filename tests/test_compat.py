"""The compat layer's guards: the verl version check, signature checks, patch-after-import."""

import sys

import pytest
import verl

from capo_verl import compat


def test_untested_verl_version_is_refused(monkeypatch):
    assert compat.check_verl_version() == "0.9.1"
    monkeypatch.setattr(verl, "__version__", "0.10.0")
    with pytest.raises(RuntimeError, match=r"tested against verl 0\.9\.1 only, but verl 0\.10\.0 is installed"):
        compat.check_verl_version()


def test_signature_mismatch_is_refused():
    def compute_advantage(data, estimator, gamma=1.0):
        pass

    compat.check_signature(compute_advantage, ["data", "estimator"], "compute_advantage")
    with pytest.raises(RuntimeError, match="compute_advantage has parameters"):
        compat.check_signature(compute_advantage, ["data", "adv_estimator"], "compute_advantage")


def test_after_import_patches_a_module_when_it_is_executed(tmp_path, monkeypatch):
    (tmp_path / "capo_probe_module.py").write_text("def f():\n    return 1\n\nVALUE = f()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []

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
