"""Every relative link and image in README.md and docs/**/*.md points at a file of the repository, and every
``#anchor`` into a markdown file names one of its headings (GitHub's slug rules). External links (``http:``,
``https:``, ``mailto:``, any ``scheme:``) are not checked.

The docs' citations are checked too (:func:`check_citations`, over the whole text, code included): every
``tests/<file>.py::name`` names a file that defines that test function or class (``::Class::method`` a method of
it); a ``::name`` without a file refers to the last ``tests/...py`` before it in the same table cell (or line,
outside tables); every ``tests/...`` and ``benchmarks/results/...`` path exists.

Every figure README.md quotes names its source (:func:`check_figure_sources`): a paragraph, list item or table row
of README.md that holds a measured figure (a number with a unit of time, share, ratio, memory or points, a signed
difference, a count of passed or failed tests) links to a committed file under ``benchmarks/results/`` or
``docs/results/``.

What counts as a link: inline links and images ``[text](target "title")`` / ``![alt](target)``, reference
definitions ``[id]: target``, and ``href="..."`` / ``src="..."`` of HTML tags. Fenced code blocks and inline code
spans are skipped.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import unicodedata
from pathlib import Path
from urllib.parse import unquote

REPO = Path(__file__).resolve().parents[1]

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:[ \t]*(<[^>]*>|\S+)")
_HTML_ATTR = re.compile(r"""<[a-zA-Z][^>]*?\b(?:href|src)\s*=\s*["']([^"']*)["']""")
_HTML_ID = re.compile(r"""<[a-zA-Z][^>]*?\b(?:id|name)\s*=\s*["']([^"']+)["']""")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def doc_files(root: Path = REPO) -> list[Path]:
    """README.md and every markdown file under docs/."""
    files = [root / "README.md"] if (root / "README.md").exists() else []
    return files + sorted((root / "docs").rglob("*.md"))


def _prose_lines(text: str):
    """``(line number, line)`` outside fenced code blocks, with inline code spans blanked out."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        m = _FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)[0] * len(m.group(1))
            continue
        if fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not line.strip(" `~"):
                fence = None
            continue
        yield number, _CODE_SPAN.sub(lambda s: " " * len(s.group(0)), line)


def _destination(line: str, start: int) -> str | None:
    """The link destination that starts at ``line[start]`` (just after ``](``), without its title."""
    i = start
    while i < len(line) and line[i] in " \t":
        i += 1
    if i < len(line) and line[i] == "<":
        end = line.find(">", i)
        return line[i + 1 : end] if end != -1 else None
    depth, j = 0, i
    while j < len(line):
        c = line[j]
        if c == "\\":
            j += 2
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            if depth == 0:
                break
            depth -= 1
        elif c in " \t":
            break
        j += 1
    return line[i:j]


def iter_links(text: str):
    """``(line number, target)`` of every link, image, reference definition and HTML href/src in ``text``."""
    for number, line in _prose_lines(text):
        m = _REF_DEF.match(line)
        if m:
            yield number, m.group(1).strip("<>")
            continue
        for m in re.finditer(r"\]\(", line):
            target = _destination(line, m.end())
            if target is not None:
                yield number, target
        for m in _HTML_ATTR.finditer(line):
            yield number, m.group(1)


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: markup removed, lower case, only letters, digits, marks, ``-``, ``_``
    and spaces kept, each space turned into ``-`` (github-slugger)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images -> their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = re.sub(r"(?<![\w\\])_(.+?)_(?!\w)", r"\1", text)  # _emphasis_ (intraword _ stays)
    text = text.replace("`", "").strip().lower()
    kept = "".join(c for c in text if c.isalnum() or c in "-_ " or unicodedata.category(c).startswith("M"))
    return kept.replace(" ", "-")


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of ``text`` (repeats get ``-1``, ``-2``, ...), plus HTML ids."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}

    def add(title: str) -> None:
        slug = github_slug(title)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")

    previous = ""
    fence = None
    for line in text.splitlines():
        m = _FENCE.match(line)
        if fence is None and m:
            fence, previous = m.group(1)[0], ""
            continue
        if fence is not None:
            if m and m.group(1)[0] == fence and not line.strip(" `~"):
                fence = None
            continue
        atx = _ATX.match(line)
        if atx:
            add(atx.group(2) or "")
            previous = ""
            continue
        is_list_item = re.match(r"^\s*([-*+]|\d+[.)])\s", previous)
        if _SETEXT.match(line) and previous.strip() and "|" not in previous and not is_list_item:
            add(previous.strip())
            previous = ""
            continue
        anchors.update(m.group(1) for m in _HTML_ID.finditer(line))
        previous = line
    return anchors


def check_file(path: Path, root: Path = REPO) -> list[str]:
    """Broken links of one markdown file, as ``"file:line: target: reason"``."""
    errors = []
    text = path.read_text(encoding="utf-8")
    rel = path.relative_to(root)
    for number, target in iter_links(text):
        where = f"{rel}:{number}: {target or '(empty)'}"
        if not target:
            errors.append(f"{where}: empty link")
            continue
        if _SCHEME.match(target):
            continue  # http(s), mailto, ...: not checked
        raw_path, _, anchor = target.partition("#")
        raw_path = unquote(raw_path.split("?", 1)[0])
        if raw_path:
            base = root if raw_path.startswith("/") else path.parent
            resolved = (base / raw_path.lstrip("/")).resolve()
        else:
            resolved = path.resolve()
        try:
            resolved.relative_to(root.resolve())
        except ValueError:
            errors.append(f"{where}: points outside the repository")
            continue
        if not resolved.exists():
            errors.append(f"{where}: no such file {resolved.relative_to(root.resolve())}")
            continue
        if anchor and resolved.is_file() and resolved.suffix.lower() == ".md":
            if unquote(anchor) not in heading_anchors(resolved.read_text(encoding="utf-8")):
                errors.append(f"{where}: no heading with anchor #{anchor} in {resolved.relative_to(root.resolve())}")
    return errors


# ------------------------------------------------------------------------------------------- cited tests and files
# a path to a Python file, optionally followed by ::names (any file: only tests/ files are checked, another one
# ends the cell's current file); a bare ::name; a tests/ or benchmarks/results/ path of any kind.
_PY_REF = re.compile(r"(?<![\w./-])([\w./-]+\.py)((?:::\w+)*)")
_BARE_REF = re.compile(r"(?<![\w.\]])::(\w+(?:::\w+)*)")
_PATH_REF = re.compile(r"(?<![\w./-])((?:tests|benchmarks/results)/[\w./*-]*)")


def _defined_names(path: Path) -> set[str]:
    """Top-level functions and classes of a Python file, and ``Class::method`` for the methods of its classes."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names.update(
                f"{node.name}::{item.name}"
                for item in node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
            )
    return names


def _cells(line: str) -> list[str]:
    """A markdown table row's cells (a row starts with ``|``), or the whole line."""
    return line.strip().strip("|").split("|") if line.lstrip().startswith("|") else [line]


def check_citations(path: Path, root: Path = REPO) -> list[str]:
    """Cited tests and result files of one markdown file that do not exist, as ``"file:line: citation: reason"``."""
    errors: list[str] = []
    rel = path.relative_to(root)
    names_of: dict[Path, set[str]] = {}

    def check_test(number: int, file: str, name: str) -> None:
        target = root / file
        if not target.is_file():
            return  # reported by the path check
        if target not in names_of:
            names_of[target] = _defined_names(target)
        if name not in names_of[target]:
            errors.append(f"{rel}:{number}: {file}::{name}: {file} defines no test function or class {name!r}")

    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for m in _PATH_REF.finditer(line):
            cited = m.group(1).rstrip(".")
            found = any(root.glob(cited.rstrip("/"))) if "*" in cited else (root / cited).exists()
            if not found:
                errors.append(f"{rel}:{number}: {cited}: no such file or folder")
        for cell in _cells(line):
            refs = sorted(
                [(m.start(), m.group(1), m.group(2)) for m in _PY_REF.finditer(cell)]
                + [(m.start(), None, "::" + m.group(1)) for m in _BARE_REF.finditer(cell)]
            )
            current = None  # the tests/ file that a bare ::name refers to
            for _, file, names in refs:
                if file is not None:
                    current = file if file.startswith("tests/") and "*" not in file else None
                    if current is None or not names:
                        continue
                elif current is None:
                    errors.append(f"{rel}:{number}: {names}: no tests/...py before it in its table cell or line")
                    continue
                check_test(number, current, names[2:])
    return errors


# ------------------------------------------------------------------------------------ README's figures and sources
#: a measured figure: a number with a unit (``5 min``, ``29 s``, ``13.7%``, ``6.8x``, ``112 MiB``, ``+4.2 points``,
#: ``17 passed``) or a signed difference (``-0.005``); versions (``0.9.1``), names (``SmolLM2-135M``, ``x86-64``)
#: and code spans are not figures
_FIGURE = re.compile(
    r"(?<![\w.])[+-]?\d[\d,]*(?:\.\d+)?\s?"
    r"(?:%|x\b|×|min\b|s\b|ms\b|h\b|points?\b|[KMGT]i?B\b|[GT]FLOP/s|passed\b|failed\b)"
    r"|(?<![\w.])[+-]\d[\d,]*(?:\.\d+)?(?![\w.])"
)
#: where a figure's source file may be
SOURCE_FOLDERS = ("benchmarks/results/", "docs/results/")
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s")


def _blocks(text: str) -> list[list[tuple[int, str]]]:
    """The paragraphs, list items and table rows of ``text`` as lists of ``(line number, prose line)``; blank lines,
    headings and fenced code end them (code spans blanked, as in :func:`_prose_lines`)."""
    blocks: list[list[tuple[int, str]]] = []
    current: list[tuple[int, str]] | None = None
    previous = 0
    for number, line in _prose_lines(text):
        after_fence, previous = number != previous + 1, number
        if not line.strip() or _ATX.match(line):
            current = None
            continue
        if current is None or after_fence or _LIST_ITEM.match(line) or line.lstrip().startswith("|"):
            current = []
            blocks.append(current)
        current.append((number, line))
    return blocks


@functools.cache
def _tracked(root: Path) -> frozenset[str] | None:
    """The files git tracks under ``root`` (staged ones included); None where ``root`` is not a git checkout."""
    try:
        run = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return frozenset(run.stdout.split("\0")) - {""} if run.returncode == 0 else None


def check_figure_sources(path: Path, root: Path = REPO) -> list[str]:
    """Blocks of ``path`` that quote a figure without a link to a committed file under :data:`SOURCE_FOLDERS`, as
    ``"file:line: figures: reason"``. Committed: tracked by git (where ``root`` is a checkout), else existing."""
    text = path.read_text(encoding="utf-8")
    rel = path.relative_to(root)
    links: dict[int, list[str]] = {}
    for number, target in iter_links(text):
        links.setdefault(number, []).append(target)
    tracked = _tracked(root)
    errors = []
    for block in _blocks(text):
        figures = [m.group(0) for _, line in block for m in _FIGURE.finditer(line)]
        if not figures:
            continue
        sources = []
        for number, _ in block:
            for target in links.get(number, []):
                if _SCHEME.match(target) or not target.split("#")[0]:
                    continue
                file = (path.parent / unquote(target.split("#")[0])).resolve()
                try:
                    name = file.relative_to(root.resolve()).as_posix()
                except ValueError:
                    continue
                if name.startswith(SOURCE_FOLDERS) and file.is_file() and (tracked is None or name in tracked):
                    sources.append(name)
        if not sources:
            errors.append(
                f"{rel}:{block[0][0]}: {', '.join(figures)}: no link to a committed file under "
                f"{' or '.join(SOURCE_FOLDERS)} in the same paragraph, list item or table row"
            )
    return errors


# --------------------------------------------------------------------------------------------------------- tests
def test_every_relative_link_and_anchor_in_the_docs_resolves():
    files = doc_files()
    assert REPO / "README.md" in files and REPO / "docs" / "README.md" in files, files
    errors = [e for f in files for e in check_file(f)]
    assert not errors, "broken links:\n" + "\n".join(errors)


def test_every_cited_test_and_result_file_exists():
    errors = [e for f in doc_files() for e in check_citations(f)]
    assert not errors, "citations of tests or results that do not exist:\n" + "\n".join(errors)


def test_every_figure_in_the_readme_links_its_committed_source():
    errors = check_figure_sources(REPO / "README.md")
    assert not errors, "figures in README.md without their source:\n" + "\n".join(errors)


def test_the_figure_checker_finds_figures_without_a_source(tmp_path):
    (tmp_path / "benchmarks" / "results" / "run_1").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "run_1" / "README.md").write_text("# run 1\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "cpu.md").write_text("# CPU\n")
    (tmp_path / "README.md").write_text(
        "# Top\n\n"
        "Sourced: 5 min 29 s and 13.7%\n"
        "([record](benchmarks/results/run_1/README.md)).\n\n"
        "- a bullet with its source: 6.8x ([run](benchmarks/results/run_1/README.md#run-1))\n"
        "- a bullet without: 41 min, after the sourced one\n"
        "  on two lines.\n\n"
        "A doc page is no source: +4.2 points and -0.005 ([CPU](docs/cpu.md)).\n\n"
        "A missing file is none: 17 passed ([gone](benchmarks/results/run_2/README.md)).\n\n"
        "| what | figure |\n|---|---|\n| row | 112 MiB |\n\n"
        "Not figures: verl 0.9.1, SmolLM2-135M on x86-64, 6 steps, 2 seeds, `3.5x in code`, in seconds.\n\n"
        "```\n9 min in a fence\n```\n"
    )
    errors = check_figure_sources(tmp_path / "README.md", tmp_path)
    found = sorted(e.split(": ")[0].split(":")[1] + " " + e.split(": ")[1] for e in errors)
    assert found == sorted(["7 41 min", "10 +4.2 points, -0.005", "12 17 passed", "16 112 MiB"]), errors


def test_the_citation_checker_finds_missing_tests_and_files(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text(
        "def test_one():\n    pass\n\n\nclass TestGroup:\n    def test_inner(self):\n        pass\n"
    )
    (tmp_path / "benchmarks" / "results" / "run_1").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "run_1" / "out.txt").write_text("1\n")
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "| patch | test |\n|---|---|\n"
        "| `verl/x.py::f` | `tests/test_a.py::test_one`, `::TestGroup::test_inner`, `::test_gone` |\n"
        "| `verl/y.py::g` | `::test_orphan` |\n"
        "See `tests/test_a.py::TestGroup` and `tests/test_b.py::test_one`,"
        " `other/code.py::thing`, `::after_other_code`.\n"
        "Results: `benchmarks/results/run_1/out.txt`, benchmarks/results/run_1/. Missing:"
        " `benchmarks/results/run_2/out.txt`, `tests/data/none.json`; globs: `tests/test_*.py`, `tests/test_z*.py`.\n"
    )
    errors = check_citations(page, tmp_path)
    cited = sorted(e.split(": ")[1] for e in errors)
    assert cited == sorted(
        [
            "tests/test_a.py::test_gone",
            "::test_orphan",
            "tests/test_b.py",
            "::after_other_code",
            "benchmarks/results/run_2/out.txt",
            "tests/data/none.json",
            "tests/test_z*.py",
        ]
    ), errors


def test_the_checker_finds_broken_links_and_anchors(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# A page\n\n## Set `x` up (twice)\n\nText.\n\n## Set `x` up (twice)\n")
    (tmp_path / "img.png").write_bytes(b"")
    (tmp_path / "README.md").write_text(
        "# Top\n\n"
        "[good](docs/page.md) [good anchor](docs/page.md#set-x-up-twice) [repeat](docs/page.md#set-x-up-twice-1)\n"
        '![image](img.png) [self](#top) [web](https://example.com/nothing) [titled](docs/page.md "title")\n'
        "[missing file](docs/nope.md)\n"
        "[missing anchor](docs/page.md#set-y-up)\n"
        "![missing image](images/none.png)\n"
        "[outside](../elsewhere.md)\n"
        "[bad self anchor](#nowhere)\n"
        "`[in code](not/checked.md)`\n\n"
        "```\n[in a fence](not/checked.md)\n```\n\n"
        "[ref]: docs/gone.md\n"
        '<img src="also/gone.png">\n'
    )
    errors = check_file(tmp_path / "README.md", tmp_path)
    broken = sorted(e.split(": ")[1] for e in errors)
    assert broken == sorted(
        [
            "docs/nope.md",
            "docs/page.md#set-y-up",
            "images/none.png",
            "../elsewhere.md",
            "#nowhere",
            "docs/gone.md",
            "also/gone.png",
        ]
    ), errors
    assert check_file(tmp_path / "docs" / "page.md", tmp_path) == []


def test_github_slug_rules():
    assert github_slug("The estimator (`capo_verl/estimators/capo.py`)") == "the-estimator-capo_verlestimatorscapopy"
    slug = github_slug("Does CAPO do what the paper says? GRPO vs CAPO")
    assert slug == "does-capo-do-what-the-paper-says-grpo-vs-capo"
    assert github_slug("SimKO policy loss (`simko`)") == "simko-policy-loss-simko"
    assert github_slug("1. Set paths once (all optional)") == "1-set-paths-once-all-optional"
    assert github_slug("[Link](x.md) and _emphasis_ and snake_case") == "link-and-emphasis-and-snake_case"
    assert github_slug("A -- B: c.d") == "a----b-cd"
    anchors = heading_anchors("# Same\n\n## Same\n\nSetext\n------\n\n```\n# not a heading\n```\n| a |\n|---|\n")
    assert anchors == {"same", "same-1", "setext"}
