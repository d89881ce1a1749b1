"""The requests and commands the docs show work as shown, and what goes wrong says so in one line (issue 68). The unit half: the whole description, and the tests on a server, are in
e2e/test_documented_requests_server.py."""

import subprocess
import sys

import pytest

from sglang_mepic.launch import warm
from support.documented_requests import DOC


def one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


# ---------------------------------------------------------------------------------------------
# The warm command's errors (no server)


def run_warm(capsys, *args) -> tuple[int, str]:
    status = warm.main(list(args))
    return status, capsys.readouterr().err


def test_a_missing_path_is_one_line_and_status_1(capsys, tmp_path):
    status, err = run_warm(capsys, str(tmp_path / "nope.txt"))
    assert status == 1 and one_line(err) == f"sglang_mepic.launch.warm: {tmp_path / 'nope.txt'}: no such file or folder"


def test_no_server_is_one_line_and_status_1(capsys, tmp_path):
    (tmp_path / "a.txt").write_text(DOC)
    status, err = run_warm(capsys, str(tmp_path / "a.txt"), "--url", "http://127.0.0.1:9")
    assert status == 1 and "cannot reach the server at http://127.0.0.1:9" in one_line(err)


@pytest.mark.parametrize("content, reason", [
    ("not json\n", "a.jsonl:1: not a JSON line"),
    ('{"body": "x"}\n', "a.jsonl:1: no string field 'text' (--field names it)"),
    (b"\xff\xfe", "a.jsonl: not UTF-8 text"),
], ids=["not-json", "no-field", "not-utf8"])
def test_a_bad_file_is_one_line_and_status_1(capsys, tmp_path, content, reason):
    file = tmp_path / "a.jsonl"
    file.write_bytes(content if isinstance(content, bytes) else content.encode())
    status, err = run_warm(capsys, str(file))
    assert status == 1 and reason in one_line(err)


def test_a_folder_without_documents_is_one_line(capsys, tmp_path):
    status, err = run_warm(capsys, str(tmp_path))
    assert status == 1 and "no documents in" in one_line(err)


def test_the_command_itself_prints_one_line(tmp_path):
    """As a user runs it: no traceback, no warnings (it imports no part of SGLang), exit status 1."""
    out = subprocess.run([sys.executable, "-m", "sglang_mepic.launch.warm", str(tmp_path / "nope")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "no such file or folder" in one_line(out.stderr) and not out.stdout


def test_the_command_posts_to_the_route_it_names():
    from sglang_mepic.frontend import known_routes

    assert (warm.ROUTE, warm.MAX_TEXTS) == (known_routes.ROUTE, known_routes.MAX_TEXTS)


# ---------------------------------------------------------------------------------------------
# A validation error's answer (no server)


def test_a_validation_error_is_answered_without_the_source_path():
    from fastapi.exceptions import RequestValidationError

    from sglang_mepic.hardening.validation_errors import without_source

    exc = RequestValidationError([{"loc": ["body"], "msg": "bad", "type": "x"}], body=b"x", endpoint_ctx={
        "file": "/site-packages/sglang/srt/entrypoints/http_server.py", "line": 933, "function": "generate_request",
        "path": "POST /generate"})
    assert "http_server.py" in str(exc)  # FastAPI's own text names it: what SGLang's handler answered with
    clean = without_source(exc)
    assert "http_server.py" not in str(clean) and "line 933" not in str(clean)
    assert clean.errors() == exc.errors() and clean.body == b"x" and "POST /generate" in str(clean)


# ---------------------------------------------------------------------------------------------
# The docs' examples, on a server
