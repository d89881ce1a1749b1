# The two set-up commands of the README (serve, test), and the fast test loop. Each installs only what is missing.
VENV   := .venv
PY     := $(VENV)/bin/python
# pytest is run as a script, not `python -m pytest`, so the repo root is not on sys.path.
STAMP  := $(VENV)/.sglang-mepic-installed
MODELS := models
HOST   ?= 127.0.0.1
PORT   ?= 30000
ARGS   ?=
PYTEST_ARGS ?=

# The unit and property tests: no server, nothing marked slow (`make test-fast`).
FAST   := not server and not slow
# make test's first part: every test that starts no server, slow ones included (Triton-interpreter kernels,
# wheel builds), on both cores (pytest-xdist): they share nothing, and the cores would otherwise wait on Python.
UNIT   := not server
WORKERS ?= 2
# make test writes each part's time here (.ci/run prints it).
TIMES  := $(VENV)/.test-times

.PHONY: serve test test-fast venv models clean-models

serve: $(STAMP) $(MODELS)/smollm2-135m/config.json
	$(PY) -m sglang_mepic.launch_server --model-path $(MODELS)/smollm2-135m --host $(HOST) --port $(PORT) $(ARGS)

# Every test once, in three pytest runs timed apart: the tests that start no server first, on both cores (a
# failing unit test shows in minutes); then the tests that start servers, two at a time (a server test
# mostly waits on its server: one at a time, a third of the 2 cores sat idle), each test file on one
# worker, so that the servers a file shares stay its own; last the server tests marked `alone`, one at a
# time: those that time what they check (the route fuzzer's budget, launch_cluster's 90 s after a Ctrl-C,
# a store's timeout), which missed under that load, and those that need the RAM for host tiers.
SERVERS := server and not alone
ALONE  := server and alone
test: $(STAMP) $(MODELS)/tiny/config.json
ifeq ($(strip $(PYTEST_ARGS)),)
	@rm -f $(TIMES); rc=0; \
	run() { name=$$1; mark=$$2; shift 2; echo "[test] $$name part: pytest -m \"$$mark\" $$*"; \
	  start=$$(date +%s); code=0; \
	  $(VENV)/bin/pytest -m "$$mark" "$$@" || code=$$?; \
	  if [ $$code -eq 5 ]; then code=0; fi; \
	  echo "[test] $$name part (-m \"$$mark\" $$*): $$(( $$(date +%s) - start )) s, exit status $$code" >> $(TIMES); \
	  return $$code; }; \
	run unit '$(UNIT)' -n $(WORKERS) || rc=1; \
	run servers '$(SERVERS)' -n $(WORKERS) --dist loadfile || rc=1; \
	run alone '$(ALONE)' || rc=1; \
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
