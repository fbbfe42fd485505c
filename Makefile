PYTHON ?= python3
PIP := $(PYTHON) -m pip
STAMP := .install.stamp

.PHONY: install demo test lint ci docs bench clean

# torch: take the CPU build on disk (2.13) when no torch is importable, so that the
# `runtime` extra's range never pulls a multi-GB CUDA build. The core install has no torch.
$(STAMP): pyproject.toml setup.py native/header_scan.c native/spans.c
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install -q "torch==2.13.0"
	$(PIP) install -q -e ".[dev,plot,runtime]"
	@touch $(STAMP)

install: $(STAMP)

demo: install
	@PYTHON=$(PYTHON) bash examples/demo.sh

test: install
	$(PYTHON) -m pytest

lint: install
	$(PYTHON) -m ruff check exl3tool tests benchmarks
	$(PYTHON) -m ruff format --check exl3tool tests benchmarks
	$(PYTHON) -c "from importlinter.cli import lint_imports_command as m; m()"

# What CI runs: lint, the built wheel in a fresh venv without torch, then the test suite.
ci:
	bash .ci/run

docs: install
	$(PYTHON) -m exl3tool.docs_gen

clean:
	rm -rf $(STAMP) build dist *.egg-info demo-out exl3tool/io/_header_scan*.so exl3tool/io/_spans*.so
