"""Helpers and fixtures shared by test modules (which never import one another), moved out of
tests/frontend/test_hint_seal.py."""


GREEDY = {"max_new_tokens": 2, "temperature": 0}
