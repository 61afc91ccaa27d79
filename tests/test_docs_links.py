"""Every relative link and image in README.md and docs/**/*.md points at a file of the repository, and every
``#anchor`` into a markdown file names one of its headings (GitHub's slug rules). External links (``http:``,
``https:``, ``mailto:``, any ``scheme:``) are not checked.

The docs' citations are checked too (:func:`check_citations`, over the whole text, code included): every
``tests/<file>.py::name`` names a file that defines that test function or class (``::Class::method`` a method of
it); a ``::name`` without a file refers to the last ``tests/...py`` before it in the same table cell (or line,
outside tables); every ``tests/...`` and ``benchmarks/results/...`` path exists.

What counts as a link: inline links and images ``[text](target "title")`` / ``![alt](target)``, reference
definitions ``[id]: target``, and ``href="..."`` / ``src="..."`` of HTML tags. Fenced code blocks and inline code
spans are skipped.
"""

from __future__ import annotations

import ast
import re
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


# --------------------------------------------------------------------------------------------------------- tests
def test_every_relative_link_and_anchor_in_the_docs_resolves():
    files = doc_files()
    assert REPO / "README.md" in files and REPO / "docs" / "README.md" in files, files
    errors = [e for f in files for e in check_file(f)]
    assert not errors, "broken links:\n" + "\n".join(errors)


def test_every_cited_test_and_result_file_exists():
    errors = [e for f in doc_files() for e in check_citations(f)]
    assert not errors, "citations of tests or results that do not exist:\n" + "\n".join(errors)


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
