"""Build data/minipar_book.txt: the book's own chapters, concatenated, as a training text.

    python data/make_corpus.py

The chapters are this repository's (MIT license, like the code), so the corpus may be
redistributed with it. The order is the book's (`_toc.yml`); MyST directive lines
(```{literalinclude} ..., :caption: ..., (label)=) are dropped, the prose and formulas stay.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "data" / "minipar_book.txt"


def chapters() -> list[Path]:
    """The book's markdown chapters, in the order of the table of contents."""
    names = re.findall(r"file:\s*(book/\S+)", (ROOT / "_toc.yml").read_text())
    return [ROOT / f"{n}.md" for n in names if (ROOT / f"{n}.md").is_file()]


def prose(text: str) -> str:
    keep = [line for line in text.splitlines()
            if not re.fullmatch(r"\(\S+\)=", line)          # MyST targets: (ch-preface)=
            and not line.startswith(("```{", ":::", ":caption:", ":language:", ":lines:",
                                    ":pyobject:", ":start-after:", ":end-before:", ":name:"))]
    return "\n".join(keep).strip() + "\n"


def main() -> None:
    OUT.write_text("\n\n".join(prose(p.read_text()) for p in chapters()))
    print(f"wrote {OUT.relative_to(ROOT)}: {OUT.stat().st_size:,} bytes from {len(chapters())} chapters")


if __name__ == "__main__":
    main()
