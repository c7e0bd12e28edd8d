# minipar: two commands on a fresh machine with Python 3.11.
#   make book   build the Jupyter Book into _build/html (executes the notebooks, cached)
#   make test   run every test: unit, multi-process and the notebooks (nbval)
# Both create .venv on first use. Also: make lab, make bench, make clean.

PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# Extra flags for `jupyter-book build`, e.g. `make book BOOK_FLAGS=-W` for warnings as errors.
BOOK_FLAGS ?=
# Extra flags for pytest, e.g. `make test PYTEST_FLAGS="-m 'not slow'"`.
PYTEST_FLAGS ?=

.PHONY: venv test book lab bench clean distclean

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
# kind of failure fails the target.
test: $(STAMP)
	$(BIN)/python -m pytest tests/ notebooks/ --nbval \
	    --nbval-sanitize-with notebooks/sanitize.cfg $(PYTEST_FLAGS)

book: $(STAMP)
	$(BIN)/jupyter-book build . $(BOOK_FLAGS)

lab: $(STAMP)
	$(BIN)/jupyter lab --notebook-dir=notebooks

bench: $(STAMP)
	$(BIN)/python benchmarks/peers.py --quick

clean:
	rm -rf _build .pytest_cache *.egg-info
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
