# Two targets are the README's quick start: `make run` and `make test`. Both install into .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
MODEL ?= vgg19
CLUSTER ?= tag-testbed
PYTEST_ARGS ?= -n 2

.PHONY: install run test bench datasets clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check -q -c constraints.txt "torch==2.13.0"
	$(BIN)/pip install --disable-pip-version-check -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# The main job on built-in defaults: plan a zoo model on a preset cluster with the shipped policy
# (checkpoints/tag-policy.pt).
run: $(STAMP)
	$(BIN)/tag plan $(MODEL) --cluster $(CLUSTER)

test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

datasets: $(STAMP)
	$(BIN)/python scripts/build_datasets.py

bench: $(STAMP)
	$(BIN)/python scripts/check_cost_model.py
	$(BIN)/python scripts/bench_sim.py
	$(BIN)/python scripts/bench_plan.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
