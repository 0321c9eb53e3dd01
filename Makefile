# Same Function, Different Geometry: the two commands are `make book` and `make test`.
# Both create .venv from requirements.txt when it is missing.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PYTHONHASHSEED := 0
export OMP_NUM_THREADS := 2
export PYDEVD_DISABLE_FILE_VALIDATION := 1

.PHONY: book test test-unit test-lib test-portable test-binder lint format outputs venv check-html bench clean

venv: $(STAMP)

$(STAMP): requirements.txt requirements-peers.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements.txt
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps -r requirements-peers.txt
	touch $(STAMP)

## make test: unit/property tests of both packages, the doctests of src and README.md, the pairing test,
## strict nbval of every chapter (pytest's settings in pyproject.toml: strict nbval, this environment's
## kernel, the sanitizer tests/nbval_sanitize.cfg, the cell timeout)
test: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadfile

## make test-unit: the fast lane, the tests of both packages and their doctests, no chapters
test-unit: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadfile tests src README.md

## make test-lib: the library on its own, as a researcher installs it: a fresh venv in a temporary
## folder, `pip install ".[test]"` from a copy of the package's files (torch pinned as in
## requirements.txt, from PyTorch's CPU index; an unreachable index is skipped at once), then the
## library's tests and doctests against the installed package, no book dependency present
## (the tests that need one skip with the reason). Prints the install's size and time.
LIBRARY_TESTS := -c tests/library.ini --rootdir . --pyargs lossgeom tests/ --ignore=tests/book
test-lib:
	set -euo pipefail; env_dir=$$(mktemp -d); trap 'rm -rf "$$env_dir"' EXIT; \
	mkdir "$$env_dir/package"; cp -r pyproject.toml README.md LICENSE src "$$env_dir/package/"; \
	rm -rf "$$env_dir"/package/src/*.egg-info; \
	t0=$$SECONDS; $(PYTHON) -m venv "$$env_dir/venv"; \
	PIP_RETRIES=0 "$$env_dir/venv/bin/pip" install --quiet --disable-pip-version-check \
	  --extra-index-url https://download.pytorch.org/whl/cpu torch==2.13.0 "$$env_dir/package[test]"; \
	echo "test-lib: installed in $$((SECONDS - t0)) s, venv $$(du -sh "$$env_dir/venv" | cut -f1)"; \
	"$$env_dir/venv/bin/python" -m pytest -q -rs $(LIBRARY_TESTS)

## make lint: ruff's rules and formatting over the packages, tests and tools (settings in
## pyproject.toml; pydocstyle (Google) and annotation rules on src/lossgeom), and the docstring
## check of lossgeom's public API (Args and Returns sections)
lint: $(STAMP)
	$(BIN)/ruff check src tests tools benchmarks _ext
	$(BIN)/ruff format --check src tests tools benchmarks _ext
	$(BIN)/python tools/check_docstrings.py

## make format: apply ruff's formatting
format: $(STAMP)
	$(BIN)/ruff format src tests tools benchmarks _ext

## make test-portable: strict nbval of every chapter again under other floating-point kernels
## (torch generic/AVX2/AVX-512 kernels, one thread, MKL's compatible path, OpenBLAS Sandybridge)
test-portable: $(STAMP)
	tools/test_portable.sh $(NOTEBOOKS)

## make test-binder: a fresh venv from exactly binder/requirements.txt imports lossgeom and runs a chapter
test-binder:
	tools/test_binder_env.sh

## make book: execute every page fresh, two at a time, into the build's jupyter-cache
## (tools/execute_book.py), build the HTML under _build/html from it (warnings fail), check that
## the build executed no page itself, and remove the cache (a later build cannot reuse stale outputs)
book: $(STAMP)
	rm -rf _build/html _build/.doctrees _build/jupyter_execute _build/.jupyter_cache
	trap 'rm -rf _build/.jupyter_cache' EXIT; \
	$(BIN)/python tools/execute_book.py fill --jobs 2 && \
	$(BIN)/jupyter-book build . -W -n --keep-going && \
	$(BIN)/python tools/execute_book.py check

## make outputs: re-sync .md/.py/.ipynb and re-execute chapters into their .ipynb (deterministic)
outputs: $(STAMP)
	$(BIN)/python tools/execute_chapters.py $(CHAPTERS)

## make check-html: open the built pages in headless Chromium; count typeset formulas and images
check-html: $(STAMP)
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)
	$(BIN)/python tools/check_html.py

## make bench: time each page's execution alone, then the whole book's wall time executed as
## `make book` does, two pages at a time (a benchmark, not a test)
bench: $(STAMP)
	$(BIN)/python benchmarks/chapter_times.py --jobs 2

clean:
	rm -rf _build
