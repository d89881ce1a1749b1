# The two set-up commands of the README (serve, test), and the fast test loop. Each installs only what is missing.
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

# The unit and property tests: no server, nothing marked slow (`make test-fast`, and make test's first part).
FAST   := not server and not slow
# make test writes each part's time here (.ci/run prints it).
TIMES  := $(VENV)/.test-times

.PHONY: serve test test-fast venv models clean-models

serve: $(STAMP) $(MODELS)/smollm2-135m/config.json
	$(PY) -m sglang_mepic.launch_server --model-path $(MODELS)/smollm2-135m --host $(HOST) --port $(PORT) $(ARGS)

# Every test once, in two pytest runs timed apart: the fast part first (a failing unit test shows in
# minutes), then the tests that start servers or take minutes. With PYTEST_ARGS, one run with them.
test: $(STAMP) $(MODELS)/tiny/config.json
ifeq ($(strip $(PYTEST_ARGS)),)
	@rm -f $(TIMES); rc=0; \
	for part in fast server-and-slow; do \
	  if [ $$part = fast ]; then mark='$(FAST)'; else mark='server or slow'; fi; \
	  echo "[test] $$part part: pytest -m \"$$mark\""; \
	  start=$$(date +%s); code=0; \
	  $(VENV)/bin/pytest -m "$$mark" || code=$$?; \
	  if [ $$code -eq 5 ]; then code=0; fi; \
	  if [ $$code -ne 0 ]; then rc=$$code; fi; \
	  echo "[test] $$part part (-m \"$$mark\"): $$(( $$(date +%s) - start )) s, exit status $$code" >> $(TIMES); \
	done; \
	cat $(TIMES); exit $$rc
else
	$(VENV)/bin/pytest $(PYTEST_ARGS)
endif

# The developers' loop: unit and property tests, no server (under 5 minutes on 2 cores).
test-fast: $(STAMP) $(MODELS)/tiny/config.json
	$(VENV)/bin/pytest -m "$(FAST)" $(PYTEST_ARGS)

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
