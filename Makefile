# minipar: two commands on a fresh machine with Python 3.11.
#   make book   build the Jupyter Book into _build/html (from the notebooks' saved outputs)
#   make test   run every test: unit, multi-process and the notebooks (nbval)
# Both create .venv on first use. Also: make lab, make bench, make clean, and
#   make test-html       open every page of the built book in headless Chromium (after make
#                        book; needs Node and Chromium)
#   make test-lab        run one notebook in JupyterLab in headless Chromium (needs Node and
#                        Chromium)
#   make test-notebooks  only the notebooks (CI runs them again on ATen's portable kernels)
#   make notebooks       re-run the notebooks and save their outputs (after editing one)

PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# Flags for `jupyter-book build`: warnings are errors (a broken reference or a page that
# loads from a CDN fails the build); `--keep-going` lists all of them, not just the first.
BOOK_FLAGS ?= -W --keep-going
# Extra flags for pytest, e.g. `make test PYTEST_FLAGS="-m 'not slow'"`.
PYTEST_FLAGS ?=

.PHONY: venv test test-notebooks notebooks book test-html test-lab vendor-mathjax vendor-plotly lab bench clean distclean

venv: $(STAMP)

# The stamp is rebuilt when pyproject.toml changes. torch comes first and pinned on its own
# so that pip takes the local CPU build and nothing later can pull a newer (CUDA) torch.
$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "minipar needs Python >= 3.11; set PYTHON=/path/to/python3.11")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install torch==2.13.0
	$(BIN)/python -m pip install -e '.[book,test]'
	touch $@

# One pytest run over tests/ and notebooks/ so the summary counts everything and either
# kind of failure fails the target. nbval re-runs each notebook and compares its outputs
# with the saved ones: text and numbers after notebooks/sanitize.cfg, never the bytes of a
# picture (notebooks/conftest.py).
NBVAL := --nbval --nbval-sanitize-with notebooks/sanitize.cfg
test: $(STAMP)
	$(BIN)/python -m pytest tests/ notebooks/ $(NBVAL) $(PYTEST_FLAGS)

test-notebooks: $(STAMP)
	$(BIN)/python -m pytest notebooks/ $(NBVAL) $(PYTEST_FLAGS)

# The book shows the outputs saved in the notebooks (`make test` proves a fresh run prints
# the same), so after editing a notebook, run it again: `make notebooks` (all) or
# `make notebooks NB=notebooks/fourd.ipynb`, or Run All in JupyterLab and save.
NB ?= notebooks/*.ipynb
notebooks: $(STAMP)
	$(BIN)/jupyter nbconvert --to notebook --execute --inplace \
	    --ExecutePreprocessor.timeout=600 $(NB)

# flock: two builds at once (two terminals, or a build during test-html) would interleave
# their files in _build; the second waits for the first.
book: $(STAMP)
	flock _build.lock $(BIN)/jupyter-book build . $(BOOK_FLAGS)

# The browser check of the built book: tests/html/check.mjs serves _build/html on
# 127.0.0.1, opens every page in Debian's Chromium (/usr/bin/chromium; .ci/run installs it)
# at 1280x800, at a phone's 390x844 and at device scale factor 2, and fails on console
# errors, requests that fail or leave the machine, broken images and links, untypeset math,
# a page wider than the screen, figure text under 9 px, a table of contents that does not
# open (phone) or fold away (laptop), captions under WCAG AA contrast, a page over 2.5 MB,
# search without snippets from file://, and explorers that do not draw or redraw. It prints
# each page's weight and the smallest figure text at 390 px. Screenshots go to
# _build/screens/, with what each explorer drew (explorers-drawn.json), which
# tests/html/test_agreement.py then compares with the Python figures; tests/html/
# test_pages.py tests book/_ext's page rewriting (`make test` leaves tests/html out:
# tests/conftest.py).
HTML_CHECK := tests/html
test-html: $(HTML_CHECK)/node_modules/.installed $(STAMP)
	@test -f _build/html/index.html || { echo "no _build/html: run make book first"; exit 1; }
	flock _build.lock node $(HTML_CHECK)/check.mjs _build/html _build/screens
	flock _build.lock $(BIN)/python -m pytest $(HTML_CHECK) --confcutdir=$(HTML_CHECK) -q

# The JupyterLab check: tests/html/lab.mjs runs the `make lab` above (as `make -C <tmp> -f
# Makefile lab`, so that its notebooks/ is a temporary copy of one notebook: Run All and
# saving never touch ours) headless on 127.0.0.1 with a token and autosave off, opens the
# notebook in Debian's Chromium and fails when opening it marks it modified, a folded
# solution shows more than "%%solution", Run All leaves an error, an exercise does not say
# "Not answered yet", a solution shows more of its output than its "Solution: ..." line, or
# the explorer takes over 2 s to redraw after its first slider moves (the median of three
# new settings, and of three it drew before). It stops the server and its kernel however
# it ends. collectives has the fastest Run All of the notebooks with an explorer and
# solutions (12 s; fourd's takes 2 min): `make test-lab LAB_NB=notebooks/fourd.ipynb`.
LAB_NB ?= notebooks/collectives.ipynb
test-lab: $(HTML_CHECK)/node_modules/.installed $(STAMP)
	node $(HTML_CHECK)/lab.mjs $(LAB_NB)

$(HTML_CHECK)/node_modules/.installed: $(HTML_CHECK)/package.json $(HTML_CHECK)/package-lock.json
	npm ci --prefix $(HTML_CHECK) --no-audit --no-fund
	touch $@

# MathJax is vendored into book/_static/mathjax so that `make book` needs no network and
# the pages load nothing from a CDN. This refreshes it from npm: only tex-chtml.js, the
# fonts it asks for and the TeX extensions it autoloads (about 2 MB, not the package's 24).
MATHJAX_VERSION := 3.2.2
MATHJAX_DIR     := book/_static/mathjax
vendor-mathjax:
	rm -rf $(MATHJAX_DIR) && mkdir -p $(MATHJAX_DIR)/output/chtml/fonts $(MATHJAX_DIR)/input/tex
	tmp=$$(mktemp -d) && cd $$tmp && npm pack --silent mathjax@$(MATHJAX_VERSION) >/dev/null \
	  && tar -xzf mathjax-$(MATHJAX_VERSION).tgz && cd $(CURDIR) \
	  && cp $$tmp/package/LICENSE $$tmp/package/es5/tex-chtml.js $(MATHJAX_DIR)/ \
	  && cp -r $$tmp/package/es5/output/chtml/fonts/woff-v2 $(MATHJAX_DIR)/output/chtml/fonts/ \
	  && cp -r $$tmp/package/es5/input/tex/extensions $(MATHJAX_DIR)/input/tex/ \
	  && rm -rf $$tmp
	du -sh $(MATHJAX_DIR)

# Plotly draws the HTML book's explorers (book/_static/minipar-explorer.js); it is vendored
# into book/_static/plotly for the same reason as MathJax. This refreshes it from npm: only
# the "basic" partial bundle (scatter, bar, pie: all the explorers use; about 1.2 MB
# minified, not the full bundle's 4.7) and its MIT licence.
PLOTLY_VERSION := 4.1.1
PLOTLY_DIR     := book/_static/plotly
vendor-plotly:
	rm -rf $(PLOTLY_DIR) && mkdir -p $(PLOTLY_DIR)
	tmp=$$(mktemp -d) && cd $$tmp && npm pack --silent plotly.js-basic-dist-min@$(PLOTLY_VERSION) >/dev/null \
	  && tar -xzf plotly.js-basic-dist-min-$(PLOTLY_VERSION).tgz && cd $(CURDIR) \
	  && cp $$tmp/package/LICENSE $$tmp/package/plotly-basic.min.js $(PLOTLY_DIR)/ \
	  && rm -rf $$tmp
	du -sh $(PLOTLY_DIR)

# JupyterLab refuses to start as root unless told so; containers often run as root.
LAB_FLAGS ?= $(if $(filter 0,$(shell id -u)),--allow-root)
lab: $(STAMP)
	$(BIN)/jupyter lab --notebook-dir=notebooks $(LAB_FLAGS)

bench: $(STAMP)
	$(BIN)/python benchmarks/peers.py --quick

clean:
	rm -rf _build .pytest_cache *.egg-info
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
