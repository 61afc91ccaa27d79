"""docs/refusals.md against the code: every refusal class and check it names exists, and every refusal class of the
modules it covers is on the page."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = (REPO / "docs" / "refusals.md").read_text()
#: the modules whose refusal classes the page lists
MODULES = ("capo_verl.outputs", "capo_verl.inputs", "capo_verl.estimators.common")


def resolve(dotted: str):
    """The object a dotted name ``capo_verl.a.b.Name`` names (the longest importable module, then attributes)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def test_every_name_on_the_page_exists():
    names = set(re.findall(r"`(capo_verl(?:\.\w+)+)`", PAGE))
    assert len(names) >= 12, names
    for name in sorted(names):
        resolve(name)  # raises for a name the code lacks
    for fn in ("capo_pairwise_advantages", "codapo_group_weights", "cde_advantages", "reference_ppl_mask"):
        assert f"`{fn}`" in PAGE and callable(resolve(f"capo_verl.estimators.{fn}"))
    script = (REPO / "scripts" / "_common.sh").read_text()
    for fn in ("capo_hydra_value", "capo_expand_home"):
        assert f"`{fn}`" in PAGE and f"\n{fn}() {{" in script


def test_every_refusal_class_is_on_the_page_and_refuses_as_a_user_mistake():
    found = []
    for module in MODULES:
        mod = importlib.import_module(module)
        for name, obj in vars(mod).items():
            if inspect.isclass(obj) and issubclass(obj, Exception) and obj.__module__ == module:
                found.append(obj)
                assert f"`{module}.{name}`" in PAGE, f"{module}.{name} is not on docs/refusals.md"
                assert issubclass(obj, ValueError), f"{name}: a refusal is a ValueError (one line, exit status 2)"
    assert len(found) == 6, found


def test_the_page_is_linked_from_the_docs_index():
    assert "(refusals.md)" in (REPO / "docs" / "README.md").read_text()
