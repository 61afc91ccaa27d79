"""The README's demo command runs and shows the paper's behaviour on its hand-made batch."""

from capo_verl import demo


def test_demo_runs(capsys):
    assert demo.main([]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("q-")]
    assert len(rows) == 7
    a_capo = {(r[0], float(r[2])): float(r[6]) for r in rows}
    assert a_capo[("q-easy", -0.40)] == 0.0  # lucky guess masked
    assert a_capo[("q-hard", -0.50)] == 0.0  # near-correct failure masked
    assert a_capo[("q-hard", -0.10)] < a_capo[("q-easy", -0.60)] < 0  # confident wrong answer pushed down most
    assert "capo/auc_mean" in out
