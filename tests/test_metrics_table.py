"""The metrics table of docs/algorithms/capo.md lists every ``capo/*`` metric the code records: the keys that
:func:`capo_verl.metrics.capo_step_metrics` returns for a batch where every one is defined."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from capo_verl.metrics import capo_step_metrics

DOC = Path(__file__).resolve().parents[1] / "docs" / "algorithms" / "capo.md"


def documented() -> set[str]:
    section = DOC.read_text().split("## Metrics", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"`(capo/[a-z0-9_]+)`", section))


def test_every_capo_metric_the_code_records_is_in_the_docs_table():
    rng = np.random.default_rng(0)
    n = 16
    group = np.repeat(np.arange(4), 4)
    correct = np.tile([True, False], n // 2)
    recorded = capo_step_metrics(
        lpm=rng.normal(-1.0, 0.3, n),
        correct=correct,
        group=group,
        valid=np.ones(n, dtype=bool),
        adv=rng.normal(size=n),
        ref_ppl=rng.uniform(1.0, 4.0, n),
        keep=rng.random(n) > 0.3,
    )
    assert len(recorded) >= 11, sorted(recorded)  # every metric is defined for this batch
    assert set(recorded) - documented() == set(), sorted(set(recorded) - documented())
    assert documented() - set(recorded) == set()  # the table names nothing the code does not record
