# The two set-up commands of the README. Each installs only what is missing.
VENV   := .venv
PY     := $(VENV)/bin/python
# pytest is run as a script, not `python -m pytest`, so the repo root is not on
# sys.path and kernels/ cannot shadow the PyPI package of the same name.
STAMP  := $(VENV)/.sglang-mepic-installed
MODELS := models
HOST   ?= 127.0.0.1
PORT   ?= 30000
ARGS   ?=
PYTEST_ARGS ?=

.PHONY: serve test venv models clean-models

serve: $(STAMP) $(MODELS)/smollm2-135m/config.json
	$(PY) -m sglang_mepic.launch_server --model-path $(MODELS)/smollm2-135m --host $(HOST) --port $(PORT) $(ARGS)

test: $(STAMP) $(MODELS)/tiny/config.json
	$(VENV)/bin/pytest $(PYTEST_ARGS)

venv: $(STAMP)

$(STAMP): requirements/cpu.lock pyproject.toml scripts/setup_venv.sh
	scripts/setup_venv.sh $(VENV)

$(MODELS)/tiny/config.json: | $(STAMP)
	SGLANG_MEPIC_MODELS=$(MODELS) $(PY) -m sglang_mepic.models tiny

$(MODELS)/smollm2-135m/config.json: | $(STAMP)
	SGLANG_MEPIC_MODELS=$(MODELS) $(PY) -m sglang_mepic.models smollm2-135m

models: $(MODELS)/tiny/config.json $(MODELS)/smollm2-135m/config.json

clean-models:
	rm -rf $(MODELS)
