"""What several test modules share: the scheduler replay harness (replay), the page oracle
(oracle), SGLang's log readers (server_log) and helpers and fixtures moved out of test
modules, which never import one another. tests/ is on sys.path (pyproject), so: `from support.replay import ...`."""
