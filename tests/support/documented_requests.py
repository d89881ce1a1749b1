"""Helpers and fixtures shared by test modules (which never import one another), moved out of
tests/tooling/test_documented_requests.py."""


DOC = " ".join(f"Paragraph {i}: the river rises in the hills and runs to the sea past the mill." for i in range(3))
