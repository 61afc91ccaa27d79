"""What a study's rewarded answers are: every unit's correct validation responses at one step, read as text.

A training result is trusted only after its rewarded answers are read: a reward that pays for a shortcut (pilot 1's
echo of the question's expression, ``Answer: 12 + 5`` for 17) shows up as a rising accuracy. For each unit
(``seed<k>/<method>``) of a ``capo-verl compare`` folder this prints, from verl's validation dump at ``--step``
(``val_generations/<step>.jsonl`` or its ``.xz`` / ``.gz``):

- ``n``: responses; ``correct``: responses the reward paid (``acc``, else ``score`` > 0.5), and their share;
- ``plain``: the share of the paid responses whose extracted answer (``pred``) is a plain number; the solving-only
  reward pays nothing else, so anything below 1.000 is a grading fault;
- ``states``: the share of the paid responses that state the calculation and its value (``a op b = v`` or
  ``a op b equals v``, the operator a symbol or a word such as ``divided by``, any wording around it) rather than
  the bare value;
- ``other``: the share of the paid responses that hold a number other than the prompt's (the operands) and the gold
  answer (``gts``, else ``pred``), compared as values (``1,000`` = ``1000.0``): a wrong value before the paid one
  (``70 - 30 is 50 ... 40``) is paid, since the reward grades the answer it extracts, so a rising share would be a
  shortcut in the making;
- the most common paid answers (``pred``) and the most common shapes of the paid responses, each number written
  ``N`` (``N + N = N``), with their counts.

    .venv/bin/python benchmarks/rewarded_answers.py benchmarks/results/compare_main_cpu/units
    .venv/bin/python benchmarks/rewarded_answers.py ~/capo_main/out --step 0 --out /tmp/answers.md

Source of the fields: verl's validation dump (``trainer.validation_data_dir``; ``output``, ``pred``, ``acc``)
as ``capo_verl.compat.validation`` writes it.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path

from capo_verl.compare.report import dump_lines, validation_dump

NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")
PLAIN = re.compile(r"^-?\d+(?:\.\d+)?$")
#: a calculation and its value, the operator as a symbol or in words: ``48 + 22 = 70``, ``65 / 13 equals 5``,
#: ``2 * 21 is 42``, ``84 divided by 12 equals 7.``, ``6 times 7 equal 42``
STATES = re.compile(
    r"\d\s*(?:[-+*/x×÷]|plus|minus|times|multiplied by|divided by)\s*-?\d[\d.,]*\s*(?:=|equals?|is)\s*-?\d",
    re.IGNORECASE,
)


def shape(text: str) -> str:
    """``text`` on one line with every number written ``N`` (``'48 + 22 = 70'`` -> ``'N + N = N'``)."""
    return NUMBER.sub("N", " ".join(text.split()))


def values(text: str) -> set[float]:
    """The numbers in ``text`` as values (``'1,000 and 6.0'`` -> ``{1000.0, 6.0}``)."""
    return {float(m.replace(",", "")) for m in NUMBER.findall(text)}


def read_unit(path: Path) -> dict:
    """The counts of the module docstring for one validation dump.

    Raises:
        ValueError: a line without ``output`` or an outcome field (not a verl validation dump).
    """
    n, paid = 0, []
    for line in dump_lines(path):
        if not line.strip():
            continue
        row = json.loads(line)
        if "output" not in row or ("acc" not in row and "score" not in row):
            raise ValueError(f"{path}: a line without 'output' and 'acc'/'score'; not a verl validation dump")
        n += 1
        if float(row["acc"] if "acc" in row else row["score"]) > 0.5:
            pred, output = str(row.get("pred", "")), str(row["output"])
            known = values(str(row.get("input", ""))) | values(str(row.get("gts", pred)))
            paid.append((pred, output, bool(values(output) - known)))
    k = len(paid)
    return {
        "n": n,
        "correct": k,
        "accuracy": k / n if n else float("nan"),
        "plain": sum(bool(PLAIN.match(p.strip())) for p, _, _ in paid) / k if k else float("nan"),
        "states": sum(bool(STATES.search(o)) for _, o, _ in paid) / k if k else float("nan"),
        "other": sum(other for _, _, other in paid) / k if k else float("nan"),
        "answers": Counter(p for p, _, _ in paid),
        "shapes": Counter(shape(o) for _, o, _ in paid),
    }


def units(folder: Path, step: int) -> list[tuple[str, Path]]:
    """``(seed<k>/<method>, dump path)`` for every unit under ``folder`` with a dump at ``step``, by seed then name."""
    found = []
    for d in folder.glob("seed*/*/val_generations"):
        path = validation_dump(d, step)
        if path.exists():
            found.append((int(d.parent.parent.name.removeprefix("seed")), d.parent.name, path))
    return [(f"seed{s}/{m}", p) for s, m, p in sorted(found)]


def report(folder: Path, step: int, top: int) -> str:
    """The markdown report of every unit under ``folder`` at ``step``.

    Raises:
        FileNotFoundError: no unit under ``folder`` has a validation dump at ``step``.
    """
    found = units(folder, step)
    if not found:
        raise FileNotFoundError(f"{folder}: no seed<k>/<method>/val_generations/{step}.jsonl[.xz|.gz]")
    lines = [
        f"# Rewarded answers at step {step}",
        "",
        f"`benchmarks/rewarded_answers.py {folder.name} --step {step}`: the validation responses the reward paid.",
        "",
        "| unit | n | correct | accuracy | plain | states | other | top answers | top shapes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, path in found:
        r = read_unit(path)
        answers = ", ".join(f"`{a}` ({c})" for a, c in r["answers"].most_common(top))
        shapes = ", ".join(f"`{s}` ({c})" for s, c in r["shapes"].most_common(top))
        lines.append(
            f"| {name} | {r['n']} | {r['correct']} | {r['accuracy']:.3f} | {r['plain']:.3f} | {r['states']:.3f} "
            f"| {r['other']:.3f} | {answers} | {shapes} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path, help="a capo-verl compare output folder (seed<k>/<method>/val_generations)")
    p.add_argument("--step", type=int, default=30, help="the validation step to read (default 30)")
    p.add_argument("--top", type=int, default=5, help="answers and shapes listed per unit (default 5)")
    p.add_argument("--out", type=Path, help="also write the report to this file")
    a = p.parse_args(argv)
    text = report(a.folder, a.step, a.top)
    print(text, end="")
    if a.out:
        a.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
