"""The book keeps its promises: one source for every number, exercises that exist and are
checked, an explorer per chapter.

- Every numeral in a chapter's prose is either written by the `{n}` role (from
  `minipar.teach.numbers`) or glued from a notebook, or it is exempt: inside a citation,
  a quotation of a source (a `>` block), math, code, a year, or a reference to a table,
  figure, section, equation or version. `tests/book_numerals/<chapter>.txt` lists the few
  that remain on purpose, each with its reason; a new one fails here.
- Every `{n}` key the book uses exists, and every `check_*` the book names is a check.
- Every chapter has at least four exercises, at least half of them of the kinds that test
  understanding (predict then run, find the bug, implement, build a schedule), each in its
  notebook with a folded worked solution that nbval runs, an introduction that says how the
  checks behave and how to open a solution, and one verdict shown per check; and an
  explorer whose static figure is on the chapter's page.
"""
from __future__ import annotations

import ast
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from minipar.teach import exercises
from minipar.teach.numbers import CHAPTERS as NUMBER_MODULES, all_numbers

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"
NOTEBOOKS = ROOT / "notebooks"
ALLOWED = Path(__file__).with_name("book_numerals")   # one file per chapter

# The chapters that end in exercises and an explorer (each has notebooks/<name>.ipynb).
CHAPTERS = ["llama3", "collectives", "data_parallel", "tensor_parallel", "pipeline_parallel",
            "context_parallel", "experts", "memory", "fourd", "mfu", "failures", "cluster", "hf"]
DEEP_KINDS = {"predict", "bug", "implement", "schedule", "design"}

# ------------------------------------------------------------------ the numeral scan
NUMERAL = re.compile(r"(?<![\w.\-/^])\d(?:[\d,]*\d)?(?:\.\d+)?(?![\w\-/])")
# Directives whose body is code, math or options, not prose; any other {directive} is prose.
CODE_DIRECTIVE = re.compile(r"^\{(code-cell|code|code-block|literalinclude|math|glue:any|"
                            r"glue:figure|glue|raw|bibliography|toctree|csv-table)\}")
FENCE = re.compile(r"^(`{3,}|~{3,}|:{3,})")
EXEMPT = [
    r"\{[\w:-]+\}`[^`]*`",                        # roles: {n}, {glue:text}, {cite}, {ref}, ...
    r"`[^`]*`",                                   # inline code
    r"\$\$.*?\$\$", r"\$[^$]+\$",                 # math
    r"\]\([^)]*\)", r"\[\^[^\]]*\]",              # link targets, footnote marks
    r"<!--.*?-->",
    r"\b(19[5-9]\d|20[0-3]\d)\b",                 # years
    r"\b(Tables?|Figures?|Fig\.|Sections?|Sec\.|§|Eq\.|Equations?|[Cc]hapters?|p\.|pp\.|"
    r"Appendix|Llama|Llama\s3\.\d|PyTorch|torch|Python|CUDA|NCCL|version|v)\s*\(?\d+(\.\d+)*\)?"
    r"(\s*(and|,|–|-|to)\s*\d+(\.\d+)*)*",        # references, versions
]


def prose_lines(text: str):
    """(line number, line) of the prose: outside code and math, option lines, quotes."""
    code, prose, in_math = None, [], False
    for i, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if code:
            if s.startswith(code) and set(s) == {code[0]}:
                code = None
            continue
        fence = FENCE.match(s)
        if fence:
            mark, rest = fence.group(1), s[len(fence.group(1)):].strip()
            if not rest and prose and prose[-1] == mark:
                prose.pop()                    # the end of a prose directive ({note} ...)
            elif rest.startswith("{") and not CODE_DIRECTIVE.match(rest):
                prose.append(mark)
            else:
                code = mark                    # a code block or a code/math directive
            continue
        if s == "$$" or (s.startswith("$$") != s.endswith("$$") or s == "$$"):
            in_math = not in_math
            continue
        if in_math or s.startswith(">") or re.match(r"^:\w[\w-]*:", s) or re.match(r"^\(.*\)=$", s):
            continue
        yield i, line


def numerals(path: Path) -> list[tuple[int, str, str]]:
    """(line, numeral, line text) for every numeral the prose states by hand."""
    found = []
    for i, line in prose_lines(path.read_text()):
        stripped = line
        for pattern in EXEMPT:
            stripped = re.sub(pattern, " ", stripped)
        found += [(i, m.group(), line.strip()) for m in NUMERAL.finditer(stripped)]
    return found


def allowed() -> Counter:
    """(file, numeral) -> how many times it may appear by hand (tests/book_numerals/)."""
    counts = Counter()
    for path in ALLOWED.glob("*.txt"):
        for line in path.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                counts[(path.stem + ".md", line.split("|")[0].strip())] += 1
    return counts


def test_numerals_in_prose_come_from_one_source():
    budget = allowed()
    new = []
    for path in sorted(BOOK.glob("*.md")):
        for line, numeral, text in numerals(path):
            key = (path.name, numeral)
            if budget[key] > 0:
                budget[key] -= 1
            else:
                new.append(f"book/{path.name}:{line}: {numeral!r} in: {text[:100]}")
    assert not new, ("numbers written by hand in the prose (use {n}`chapter.key` from "
                     "minipar.teach.numbers, or glue from a notebook):\n" + "\n".join(new))


def test_allowed_numerals_are_still_there():
    """An entry of book_numerals.txt that the book no longer has must go."""
    present = Counter((p.name, n) for p in BOOK.glob("*.md") for _, n, _ in numerals(p))
    stale = [f"{f}: {n}" for (f, n), k in allowed().items() if present[(f, n)] < k]
    assert not stale, "tests/book_numerals/ lists numerals the book no longer has:\n" + "\n".join(stale)


def test_scan_catches_a_hand_written_number(tmp_path):
    page = tmp_path / "x.md"
    page.write_text("The run took 7.2 s on {n}`llama3.gpus` GPUs in 2024 (Table 4),\n"
                    "$2(n-1)/n$ bytes, `--tp 8`, H100s.\n\n```python\nx = 3\n```\n"
                    "> the paper says 54 days\n")
    assert [n for _, n, _ in numerals(page)] == ["7.2"]


# ------------------------------------------------------------------ numbers and checks exist
def _texts():
    for path in sorted(BOOK.glob("*.md")):
        yield path.name, path.read_text()
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        nb = json.loads(path.read_text())
        yield path.name, "\n".join("".join(c["source"]) for c in nb["cells"])


def test_every_number_the_book_uses_exists():
    numbers = all_numbers()
    missing = [f"{name}: {key}" for name, text in _texts()
               for key in re.findall(r"\{n\}`([^`]+)`", text) if key.strip() not in numbers]
    assert not missing, "unknown {n} keys:\n" + "\n".join(missing)


def test_every_number_module_is_a_known_chapter():
    assert set(NUMBER_MODULES) <= set(CHAPTERS) | {"intro", "accuracy"}


def test_every_check_the_book_names_exists():
    """An exercise check, or another package function named check_* (checkpoint.check_resume)."""
    defined = set(exercises.REGISTRY) | {
        name for path in (ROOT / "minipar").rglob("*.py")
        for name in re.findall(r"^\s*def (check_\w+)", path.read_text(), re.M)}
    defined |= {n for _, text in _texts() for n in re.findall(r"def (check_\w+)", text)}
    missing = [f"{name}: {check}" for name, text in _texts()
               for check in set(re.findall(r"\b(check_\w+)", text)) if check not in defined]
    assert not missing, "the book names checks that do not exist:\n" + "\n".join(missing)


# ------------------------------------------------------------------ exercises and explorers
def _notebook(chapter: str) -> list[dict]:
    return json.loads((NOTEBOOKS / f"{chapter}.ipynb").read_text())["cells"]


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_has_four_exercises_that_test_understanding(chapter):
    checks = exercises.exercises_of(chapter)
    assert len(checks) >= 4, f"{chapter}: {len(checks)} exercises, at least 4 wanted"
    deep = [c for c, kind in checks.items() if kind in DEEP_KINDS]
    assert len(deep) >= 3 and 2 * len(deep) >= len(checks), (
        f"{chapter}: only {len(deep)} of {len(checks)} exercises are "
        f"predict/bug/implement/schedule (at least 3, and half)")


COUNT_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve".split())}
STATED_COUNT = re.compile(r"\b(\w+) (?:checked )?exercises\b|ends with (\w+),", re.IGNORECASE)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_a_stated_number_of_exercises_is_the_number_there_are(chapter):
    """"Five exercises end the notebook" (the chapter) and "four checked exercises" (the
    notebook's introduction) must count the checks the chapter registers."""
    want = len(exercises.exercises_of(chapter))
    notebook = "\n".join("".join(c["source"]) for c in _notebook(chapter) if c["cell_type"] == "markdown")
    for where, text in (("book", (BOOK / f"{chapter}.md").read_text()), ("notebook", notebook)):
        for m in STATED_COUNT.finditer(" ".join(text.split())):
            word = next(g for g in m.groups() if g).lower()
            if word in COUNT_WORDS:
                assert COUNT_WORDS[word] == want, f"{chapter} {where}: {m.group(0)!r}, but {want} checks"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_each_exercise_is_in_its_notebook_with_a_worked_solution(chapter):
    cells = [c for c in _notebook(chapter) if c["cell_type"] == "code"]
    source = "\n".join("".join(c["source"]) for c in cells)
    solutions = "\n".join("".join(c["source"]) for c in cells
                          if "solution" in c.get("metadata", {}).get("tags", []))
    for check in exercises.exercises_of(chapter):
        assert re.search(rf"\b{check}\(", source), f"{chapter}.ipynb never calls {check}"
        assert re.search(rf"assert {check}\(", solutions), (
            f"{chapter}.ipynb has no hidden worked solution (a cell tagged 'solution' that "
            f"asserts {check}(...))")


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_solutions_are_folded_in_the_book_and_in_jupyterlab(chapter):
    """`hide-cell` folds a solution in the book; JupyterLab reads the cell's `jupyter`
    metadata instead (source and output collapsed until the reader opens them)."""
    for cell in _notebook(chapter):
        meta = cell.get("metadata", {})
        if "solution" in meta.get("tags", []):
            start = "".join(cell["source"]).splitlines()[0]
            assert "hide-cell" in meta["tags"], f"{chapter}.ipynb: {start!r} is not hide-cell"
            assert meta.get("jupyter", {}).get("source_hidden") is True, (
                f"{chapter}.ipynb: {start!r} lacks jupyter.source_hidden")
            assert meta["jupyter"].get("outputs_hidden") is True, (
                f"{chapter}.ipynb: {start!r} lacks jupyter.outputs_hidden")


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_explorer_cells_leave_no_empty_box_in_the_book(chapter):
    """An explorer's output is a live widget, which the offline book cannot draw: the cell
    is tagged `remove-output` (the chapter's page shows the explorer's static figure)."""
    cells = [c for c in _notebook(chapter)
             if c["cell_type"] == "code" and "explore(" in "".join(c["source"])]
    assert cells and all("remove-output" in c["metadata"].get("tags", []) for c in cells), (
        f"{chapter}.ipynb: the explorer's cell is not tagged remove-output")


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_exercises_say_how_checks_behave_and_how_to_open_a_solution(chapter):
    intros = [" ".join("".join(c["source"]).split()) for c in _notebook(chapter)
              if c["cell_type"] == "markdown" and "".join(c["source"]).startswith("## Exercises")]
    assert len(intros) == 1, f"{chapter}.ipynb: {len(intros)} '## Exercises' cells"
    for words in ("tolerance", "unit", "reveal=True", "In JupyterLab, click", "to unfold it",
                  "Show code cell content"):
        assert words in intros[0], f"{chapter}.ipynb's exercises do not say {words!r}"


def _last_expression(source: str):
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
    body = ast.parse(code).body
    return body[-1].value if body and isinstance(body[-1], ast.Expr) else None


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_each_check_shows_its_own_verdict(chapter):
    """A cell that ends in two checks shows a tuple of verdicts: print each instead."""
    for cell in _notebook(chapter):
        last = _last_expression("".join(cell["source"])) if cell["cell_type"] == "code" else None
        if isinstance(last, ast.Tuple):
            checks = [e for e in last.elts if isinstance(e, ast.Call)
                      and getattr(e.func, "id", "").startswith("check_")]
            assert not checks, f"{chapter}.ipynb shows {len(checks)} verdicts as one tuple"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_has_an_explorer(chapter):
    import importlib
    module = importlib.import_module(f"minipar.teach.explorers.{chapter}")
    assert callable(module.explore) and callable(module.figure)
    source = "\n".join("".join(c["source"]) for c in _notebook(chapter))
    assert "explore(" in source, f"notebooks/{chapter}.ipynb does not open its explorer"
    page = (BOOK / f"{chapter}.md").read_text()
    assert f"```{{explorer}} {chapter}\n" in page, (       # book/_ext/explorer_html.py
        f"book/{chapter}.md does not show its explorer (live in the HTML, its static figure "
        "as the fallback)")


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_explorer_builds_its_controls_and_redraws(chapter, monkeypatch):
    import importlib

    import matplotlib.pyplot as plt
    from minipar.teach.explorers.prefetch import Prefetcher
    # no guesses: their worker process would outlive the test in pytest's own (and plan
    # for seconds meanwhile); tests/test_explorers_web.py tests the prefetcher
    monkeypatch.setattr(Prefetcher, "warm", lambda self, keys: None)
    explore = importlib.import_module(f"minipar.teach.explorers.{chapter}").explore
    columns = explore().children[0].children          # two columns of controls, then the figure
    controls = [c for column in columns for c in column.children]
    assert len(controls) >= 4 and all(c.description for c in controls)
    first = controls[0]
    options = list(getattr(first, "options", ()))
    if options:                                       # moving a control redraws without error
        first.value = options[0] if first.value != options[0] else options[-1]
    plt.close("all")


def test_no_number_is_defined_twice():
    """A dict literal keeps the last of two equal keys silently: one key, one definition."""
    twice = []
    for path in sorted((ROOT / "minipar/teach/numbers").glob("*.py")):
        seen = Counter()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict):
                seen.update(k.value for k in node.keys if isinstance(k, ast.Constant))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
                seen.update(k.arg for k in node.keywords if k.arg)
        twice += [f"{path.stem}.{key}" for key, n in seen.items() if n > 1]
    assert not twice, "numbers defined twice: " + ", ".join(twice)


# ------------------------------------------------------------------ figures drawn for the page
# The book's text column at 1280 px (where `make test-html` reads the pages): a figure wider
# than 1.5 columns is shrunk too much, and its smallest text must still read at 9 px.
COLUMN_PX, MAX_SHRINK, MIN_TEXT_PX = 672, 1.5, 9


def _mpfigs() -> list[tuple[str, str]]:
    """(function, kwargs text) of every {mpfig} directive of the chapters, each once, and of
    every {explorer}'s static figure (`explorers.<chapter>.figure`)."""
    found = []
    for path in sorted(BOOK.glob("*.md")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            line = re.sub(r"^```\{explorer\} (\w+)", r"```{mpfig} explorers.\1.figure", line)
            if directive := re.match(r"^```\{mpfig\} (\S+)", line):
                options = {}
                for option in lines[i + 1:]:
                    if not (m := re.match(r"^:(\w+):\s*(.*)$", option)):
                        break
                    options[m.group(1)] = m.group(2)
                found.append((directive.group(1), options.get("kwargs", "")))
    return list(dict.fromkeys(found))


@pytest.mark.parametrize("target, kwargs", _mpfigs(), ids=lambda x: x or "-")
def test_figure_is_drawn_for_the_column(target, kwargs):
    """As `{mpfig}` draws it (book/_ext/minipar_book.py): no more than 1.5x wider than the
    column, and its smallest text at least 9 px as shown there."""
    import io
    import struct
    import sys

    import matplotlib.pyplot as plt
    from matplotlib.text import Text
    sys.path.insert(0, str(BOOK / "_ext"))
    import minipar_book

    fig = minipar_book.draw(target, minipar_book._kwargs(kwargs))
    png = io.BytesIO()
    fig.savefig(png, dpi=minipar_book.DPI, bbox_inches="tight")
    width = struct.unpack(">I", png.getvalue()[16:20])[0]          # the PNG header's width
    shown = min(1.0, COLUMN_PX / width)
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    smallest = min(texts, key=lambda t: t.get_fontsize())
    px = smallest.get_fontsize() * minipar_book.DPI / 72 * shown
    plt.close("all")
    assert width <= MAX_SHRINK * COLUMN_PX, (
        f"{target}: {width} px wide, shown {width / COLUMN_PX:.2f}x smaller in the "
        f"{COLUMN_PX} px column (draw it minipar.teach.style.PAGE_WIDTH wide)")
    assert px >= MIN_TEXT_PX, (
        f"{target}: {smallest.get_text()!r} at {smallest.get_fontsize():g} pt reads at "
        f"{px:.1f} px in the column (at least {MIN_TEXT_PX})")


def test_code_lines_wrap_under_their_indent_and_copy_exactly():
    """book/_ext/reading.py puts each line of a code block in a span with its indentation:
    the text a reader copies is the block's, unchanged."""
    import sys
    sys.path.insert(0, str(BOOK / "_ext"))
    import reading

    block = ('<div class="highlight"><pre><span></span><span class="k">def</span> f():\n'
             '    <span class="k">return</span> <span class="s2">&quot;a&lt;b&quot;</span>\n\n</pre></div>')
    wrapped = reading.BLOCK.sub(reading._lines, block)
    text = lambda html: re.sub(r"<[^>]+>", "", html)      # noqa: E731
    assert text(wrapped) == text(block)
    assert wrapped.count('class="line"') == 3 and "--indent:4ch" in wrapped


# Claims an expert reading found wrong (issue 28's list), each with the chapter it was in:
# corrected once, they must not come back.
OLD_CLAIMS = {
    "collectives.md": ["is largest for small $n$ and tends to a factor of two"],
    "mfu.md": ["That is the reason DP\nis outermost", "is the explanation the paper gives",
               "Megatron-LM counts half", "they are minipar"],
    "intro.md": ["bytes counted by `CommLog`, memory and step times of the small runs are\nmeasured"],
    "data_parallel.md": ["each bucket reduce-scattered as soon as it is ready | $2\\frac{n-1}{n} G$"],
    "fourd.md": ["TP moves $8 \\cdot \\frac{t-1}{t} \\cdot b s h$ activation bytes",
                 "of a 405B block's compute"],
    "llama3.md": ["what Llama 3 kept exactly, the\npaper does not list", "traffic that crosses pods gets a seventh",
                  "llama3.attention_share_8k", "llama3.tp_nic_ms"],
    "memory.md": ["$v = 8$"],
    "tensor_parallel.md": ["never the activations", "{ref}`ch-mfu` fits to Table 4"],
    "cluster.md": ["is not rail-optimized {ev}`paper`", "cluster.activation_MB"],
}
# Issue 40's list (the book's truth, third pass): item number, then the retired wording.
ISSUE_40 = {
    "data_parallel.md": ["The replay of {ref}`ch-cluster`",                     # 1
                         "The same run at H100 speed",                           # 20
                         "data_parallel.row1_dp_s_zero2",                        # 0.8 vs 0.73 s
                         "data_parallel.row1_dp_gb_zero2",
                         '"for numerical stability"{ev}`paper`'],                # 18
    "tensor_parallel.md": ["The replay of {ref}`ch-cluster`", "The same run at H100 speed",   # 1, 20
                           "so all of it is on the step's critical path",        # 6
                           "`formulas.memory.layer_saved_elements`), against",   # 11
                           "and never larger than a\nserver"],                   # 25
    "pipeline_parallel.md": ["The replay of {ref}`ch-cluster`", "The same run at H100 speed",  # 1, 20
                             "one below it would say Llama 3's program\nwaits less"],         # 9
    "context_parallel.md": ["The replay of {ref}`ch-cluster`", "The same run at H100 speed",   # 1, 20
                            "That is the trade Llama 3 made"],                   # 17
    "fourd.md": ["The replay of {ref}`ch-cluster` is a second",                  # 1, 20
                 "is a second\nderivation",                                     # 20
                 "$b_g = 2$ for\nMegatron's bf16",                              # 5
                 "\\frac{c-1}{c}\\cdot\\frac{4\\, s\\, n_{kv} d}",           # 15
                 "The drop from 8K to 16K GPUs is the bubble, as the PP rule predicts",  # 16
                 "which have no tree, stay\nrings",                             # 23
                 "and never beyond\nthe server"],                               # 25
    "mfu.md": ["the replay of {ref}`ch-cluster` reads",                          # 1
               "ZeRO-1: reduce-scatter of the fp32 gradients once per step",     # 2
               "Within the table the model says why the rows differ",            # 7
               "the slowest measured\nhere",                                    # 8
               "one below it would say Llama 3's program\nwaits less",          # 9
               "TP sends {n}`mfu.tp_over_dp` times more than DP",                # 21
               "mfu.row1_mfu_llama3"],                                           # row 1's MFU, one key
    "llama3.md": ["llama3.dp_step_gb", "llama3.dp_rs_gb",                        # 3, DP bytes
                  "overlapped with computation | {n}`llama3.dp_step_gb`",        # 3
                  "a Llama\nblock, with its wider SwiGLU MLP, keeps more",       # 11
                  "The paper's explanation\n{ev}`paper`, which the pipeline chapter quantifies",  # 12
                  "| vocabulary | {n}`llama3.vocab` tokens |"],                  # 13
    "memory.md": ["({n}`memory.hbm_gib` = {n}`memory.hbm_gb`; `nvidia-smi` shows"],   # 24
    "intro.md": ["into _build/html, running every notebook"],                   # 22
    "preface.md": ["into _build/html, running every notebook",                  # 22
                   "its interactive widgets appear as static figures"],          # 22
}


def test_issue_40_claims_stay_corrected():
    for chapter, claims in ISSUE_40.items():
        text = (ROOT / "book" / chapter).read_text()
        for claim in claims:
            assert claim not in text, (chapter, claim)


# ------------------------------------------------------------------ the method before the machinery
# Issue 40: the 4D and MFU chapters open with the reader's method by hand (a section of
# inequalities, one per axis in the 4D chapter), state the cost model's error on published
# runs, source by source, before the first number the cost model predicts, and quote every
# cost-model MFU with its band ("48% (43 to 49%)"), never alone.
METHOD = {"fourd.md": ("sec-fourd-method", ("TP", "CP", "PP", "DP")),
          "mfu.md": ("sec-mfu-method", ())}
ERROR_KEYS = [f"accuracy.src_{source}_{what}" for source in ("table4", "playbook", "nemo")
              for what in ("mean", "bias")]
BANDED = re.compile(r"\d+% \(\d+ to \d+%\)")
INEQUALITY = re.compile(r"\\le\b|\\ge\b|\\leq\b|\\geq\b")


def cost_model_number(n) -> bool:
    """A number the cost model (or the replay, whose physics is the cost model's) computed:
    it names its scenario (`core.in_scenario`), carries a band, or says it was replayed."""
    from minipar.teach.numbers.core import Predicted
    return isinstance(n, Predicted) or bool(n.scenario) or "replays." in n.source


def _roles(text: str) -> list[tuple[int, str]]:
    return [(m.start(), m.group(1).strip()) for m in re.finditer(r"\{n\}`([^`]+)`", text)]


def method_problems(text: str, label: str, axes, numbers: dict) -> list[str]:
    """What keeps a chapter from opening with the method: its first section is not the
    labelled "The method" section, an axis has no subsection with an inequality, the section
    uses a cost-model number, or a source's error comes after the first prediction."""
    sections = re.findall(r"^(?:\(([\w-]+)\)=\n)?## (.+)$", text, re.M)
    if not sections or sections[0] != (label, sections[0][1]) or not sections[0][1].startswith("The method"):
        return [f"the first section is {sections[:1]}, not ({label})= '## The method...'"]
    start = text.index(f"({label})=")
    end = text.find("\n## ", text.index("\n## ", start) + 1)
    body = text[start:end if end > 0 else len(text)]
    problems = [] if INEQUALITY.search(body) else ["the method states no inequality"]
    for axis in axes:
        sub = re.search(rf"^### {axis}\b.*?(?=^### |\Z)", body, re.M | re.S)
        if not sub or not INEQUALITY.search(sub.group(0)):
            problems.append(f"no '### {axis}' subsection with an inequality")
    problems += [f"the method uses the cost model's {k}" for _, k in _roles(body)
                 if k in numbers and cost_model_number(numbers[k])]
    roles = _roles(text)
    first = next((pos for pos, k in roles if k in numbers and cost_model_number(numbers[k])), len(text))
    for key in ERROR_KEYS:
        if not any(k == key and pos < first for pos, k in roles):
            problems.append(f"{key} is not stated before the first prediction")
    return problems


def unbanded(text: str, numbers: dict) -> list[str]:
    """The cost-model MFUs (and TFLOP/s) a page states without their band."""
    bad = []
    for _, key in dict.fromkeys(_roles(text)):
        n, name = numbers.get(key), key.rpartition(".")[2]
        if n is not None and ("mfu" in name or "tflops" in name) and cost_model_number(n) \
                and not BANDED.fullmatch(n.text()):
            bad.append(f"{key} = {n.text()}")
    return bad


@pytest.mark.parametrize("chapter", METHOD)
def test_chapter_opens_with_the_method_and_the_models_error(chapter):
    label, axes = METHOD[chapter]
    problems = method_problems((BOOK / chapter).read_text(), label, axes, all_numbers())
    assert not problems, f"book/{chapter}:\n" + "\n".join(problems)


@pytest.mark.parametrize("chapter", METHOD)
def test_every_cost_model_mfu_carries_its_band(chapter):
    bad = unbanded((BOOK / chapter).read_text(), all_numbers())
    assert not bad, f"book/{chapter} quotes cost-model MFUs without their band:\n" + "\n".join(bad)


def test_the_method_checks_can_fail():
    """A page that predicts before it states the errors, lacks an axis's inequality and
    quotes an MFU without its band fails each check."""
    numbers = all_numbers()
    numbers = {**numbers, "x.row_mfu": numbers["mfu.row1_tflops_model"]}
    page = ("# T\n\n(sec-m)=\n## The method\n\n### TP\n\n$$a \\le b$$\n\n### CP\n\nno inequality\n\n"
            "## Then\n\n{n}`x.row_mfu` and {n}`mfu.row1_mfu_model`, then "
            + ", ".join(f"{{n}}`{k}`" for k in ERROR_KEYS) + ".\n")
    problems = method_problems(page, "sec-m", ("TP", "CP"), numbers)
    assert "no '### CP' subsection with an inequality" in problems
    assert sum("before the first prediction" in p for p in problems) == len(ERROR_KEYS)
    assert method_problems(page.replace("(sec-m)=\n", ""), "sec-m", (), numbers)[0].startswith("the first section")
    assert unbanded(page, numbers) == [f"x.row_mfu = {numbers['x.row_mfu'].text()}"]


def test_corrected_claims_stay_corrected():
    for chapter, claims in OLD_CLAIMS.items():
        text = (ROOT / "book" / chapter).read_text()
        for claim in claims:
            assert claim not in text, (chapter, claim)


# ------------------------------------------------------------------ one quantity, one key
# A quantity several chapters state names itself (`Number.quantity`); the registry refuses
# a second key for it, and the prose may state it only through that key: its words
# (`QUANTITIES`) after any other number, within a few words, fail here.
ROLE_OR_NUMERAL = re.compile(r"\{n\}`([\w.]+)`|" + NUMERAL.pattern)
NEAR = 40                                   # characters between the number and the words


def _sentences(path: Path):
    """(first line, sentence) of the prose's paragraphs, with math and inline code blanked."""
    paragraphs, last = [], -1
    for i, line in prose_lines(path.read_text()):
        if i != last + 1 or not line.strip():
            paragraphs.append((i, []))
        paragraphs[-1][1].append(line.strip())
        last = i
    for i, lines in paragraphs:
        text = re.sub(r"\$[^$]+\$|(?<!\})`[^`]*`", " ", " ".join(lines))
        for sentence in re.split(r"(?<=[.;!?])\s", text):
            yield i, sentence


def stated_elsewhere(path: Path, numbers: dict) -> list[str]:
    """Where the page states a quantity with a number that is not the quantity's key."""
    from minipar.teach.numbers.core import QUANTITIES, quantity_keys
    keys, bad = quantity_keys(numbers), []
    for i, sentence in _sentences(path):
        for quantity, words in QUANTITIES.items():
            for m in re.finditer(words, sentence):
                before = [t for t in ROLE_OR_NUMERAL.finditer(sentence[:m.start()])
                          if m.start() - t.end() <= NEAR]
                if not before:
                    continue
                key, numeral = before[-1].group(1), before[-1].group(0)
                own = keys[quantity]           # one key per scenario (`core.in_scenario`)
                if key not in own and (key or not any(numeral in numbers[k].text() for k in own)):
                    bad.append(f"book/{path.name}:{i}: {quantity} stated by "
                               f"{key or numeral!r}, not {' or '.join(sorted(own))}: {sentence.strip()[:90]}")
    return bad


def test_a_quantity_is_stated_by_its_one_key():
    numbers = all_numbers()
    bad = [b for path in sorted(BOOK.glob("*.md")) for b in stated_elsewhere(path, numbers)]
    assert not bad, "one quantity, one key:\n" + "\n".join(bad)


def test_every_quantity_has_its_key():
    from minipar.teach.numbers.core import QUANTITIES, quantity_keys
    assert set(quantity_keys(all_numbers())) == set(QUANTITIES)


def test_the_quantity_checks_can_fail(tmp_path):
    from minipar.teach.numbers.core import Number, merge
    with pytest.raises(ValueError, match="b.y and a.x both state"):
        merge({"a": {"x": Number(16, quantity="state_bytes_per_param")},
               "b": {"y": Number(18, quantity="state_bytes_per_param")}})
    page = tmp_path / "x.md"
    page.write_text("Adam keeps 16 bytes of state per parameter. With {n}`llama3.gpus`\nbytes of "
                    "state per param too. But `x = 16` bytes of state per param is code.\n")
    assert len(stated_elsewhere(page, all_numbers())) == 2


def test_one_scenario_states_a_quantity_once(tmp_path):
    """Issue 40: row 1's exposed DP time was 0.8 s in one chapter and 0.73 s in two others,
    two estimates of one scenario under two keys. Two keys of one quantity and scenario fail
    (`merge`); one per scenario passes, and the prose may use either, a numeral neither."""
    from minipar.teach.numbers.core import Number, in_scenario, merge
    a = in_scenario({"row1_dp_s": Number(0.73, "{:.2f} s")}, "table4-row1", {"row1_dp_s": "dp_exposed_s"})
    b = in_scenario({"dp_s": Number(0.8, "{:.1f} s")}, "table4-row1", {"dp_s": "dp_exposed_s"})
    with pytest.raises(ValueError, match="of scenario 'table4-row1'"):
        merge({"mfu": a, "data_parallel": b})
    c = in_scenario({"dp_s": Number(0.0, "{:.1f} s")}, "row1-zero1", {"dp_s": "dp_exposed_s"})
    numbers = merge({"mfu": a, "data_parallel": c})
    page = tmp_path / "x.md"
    page.write_text("It leaves {n}`mfu.row1_dp_s` of DP time exposed per step, "
                    "and {n}`data_parallel.dp_s` of DP time exposed with ZeRO-1. "
                    "Another estimate leaves 0.8 s of DP time exposed.\n")
    assert len(stated_elsewhere(page, numbers)) == 1


def test_cost_model_numbers_name_their_scenario():
    """A number the cost model estimated for a layout says which scenario (`core.SCENARIOS`),
    in its `scenario` and its source."""
    unnamed = [key for key, n in all_numbers().items()
               if re.search(r"^cost model\b|costmodel\.(table4|estimate|best_configs|planner)\b|"
                            r"replays\.estimated", n.source)
               and not n.scenario]
    assert not unnamed, "cost-model numbers without a scenario:\n" + "\n".join(sorted(unnamed))


# Two chapters' keys whose numbers read the same, with a unit ("7.3 TB", "14 µs"), are one
# quantity stated twice unless they are listed here as different quantities that agree.
COINCIDENT = {
    frozenset({"context_parallel.long_stage_gb", "memory.row2_acts_gb", "hf.kv_long_GB"}):
        "a CP16 stage's activations at 128K, row 2's activations, a 70B KV cache at 128K",
    frozenset({"tensor_parallel.layer_weights_gb", "mfu.mem_params_gb"}):
        "one layer's bf16 weights; row 1's weights per GPU (8 layers over TP8)",
    frozenset({"data_parallel.first_bucket_mb", "failures.per_gpu_min"}):
        "DDP's first bucket; the paper's smallest per-GPU checkpoint piece",
    frozenset({"data_parallel.bucket_mb", "mfu.nanotron_bucket_mb"}):
        "minipar's default bucket; nanotron's, from its own source",
}


def test_no_quantity_is_stated_under_two_keys():
    numbers, by_text = all_numbers(), {}
    for key, number in numbers.items():
        text = number.text()
        if number.recorded:
            continue        # read off a replay of a recorded run: its agreement with another
            # number is chance, never one quantity (`Number.recorded`)
        if re.match(r"[\d.,]+\s?[A-Za-zµ]", text) and "e+" not in text:
            by_text.setdefault(text, set()).add(key)
    twice = {frozenset(keys) for keys in by_text.values()
             if len({key.split(".")[0] for key in keys}) > 1}
    unexplained = [f"{' = '.join(sorted(k))} ({numbers[next(iter(k))].text()})"
                   for k in twice - set(COINCIDENT)]
    assert not unexplained, ("one quantity under two keys? refer to one, or list them in "
                             "COINCIDENT with what each is:\n" + "\n".join(unexplained))
    assert not set(COINCIDENT) - twice, "COINCIDENT lists numbers that no longer agree"
