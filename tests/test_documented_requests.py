"""The requests and commands the docs show work as shown, and what goes wrong says so in one line (issue 68).

- `python -m sglang_mepic.launch.warm`: a missing path, an unreadable file or no server ended in a
  traceback; now one line and exit status 1. Its docstring's examples are run as written.
- The `/mepic/chunks` examples of README.md and docs/chunks.md registered placeholder texts shorter
  than the 64 characters a text needs (a 400); the separator example of docs/chunks.md had no
  content-type header, and its 400 named the server's source file and line.
- Ollama's `/api/generate` with an empty prompt is Ollama's way to load a model: a 200, `done`, nothing
  generated (docs/limits.md said 400).

The server tests share one server with registered texts and the separator on, as the examples need.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from sglang_mepic.launch import warm
from sglang_mepic.process.server_process import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
DOC = " ".join(f"Paragraph {i}: the river rises in the hills and runs to the sea past the mill." for i in range(3))


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

    from sglang_mepic.frontend.validation_errors import without_source

    exc = RequestValidationError([{"loc": ["body"], "msg": "bad", "type": "x"}], body=b"x", endpoint_ctx={
        "file": "/site-packages/sglang/srt/entrypoints/http_server.py", "line": 933, "function": "generate_request",
        "path": "POST /generate"})
    assert "http_server.py" in str(exc)  # FastAPI's own text names it: what SGLang's handler answered with
    clean = without_source(exc)
    assert "http_server.py" not in str(clean) and "line 933" not in str(clean)
    assert clean.errors() == exc.errors() and clean.body == b"x" and "POST /generate" in str(clean)


# ---------------------------------------------------------------------------------------------
# The docs' examples, on a server


@pytest.fixture(scope="module")
def server(tiny_model):
    with ServerProcess(tiny_model, "--dtype", "float32", "--mepic-auto-chunk", "known",
                       "--mepic-separator", " # # ", startup_timeout=900) as s:  # a loaded 2-core machine
        yield s


CURL = re.compile(r"curl -s \S+?:30000(/[\w/]+)((?:\s+-H '[^']*')*)\s*\\?\s*-d '([^']*)'", re.S)


def curls(doc: str, route: str) -> list[tuple[dict, str]]:
    """(headers, body) of each `curl` example of a doc that posts to `route`, as written."""
    found = []
    for path, headers, body in CURL.findall((ROOT / doc).read_text()):
        if path == route:
            found.append((dict(h.split(": ", 1) for h in re.findall(r"-H '([^']*)'", headers)), body))
    assert found, f"{doc} shows no curl to {route}"
    return found


def send(server, route: str, headers: dict, body: str) -> requests.Response:
    # curl -d without a content-type header sends application/x-www-form-urlencoded
    headers = headers or {"content-type": "application/x-www-form-urlencoded"}
    return requests.post(server.url + route, data=body.encode(), headers=headers, timeout=120)


@pytest.mark.server
@pytest.mark.parametrize("doc", ["docs/chunks.md", "README.md"])
def test_the_documented_registration_is_accepted(server, doc):
    (headers, body), = curls(doc, "/mepic/chunks")
    r = send(server, "/mepic/chunks", headers, body)
    assert r.status_code == 200, r.text
    texts = json.loads(body)["texts"]
    assert [t["index"] for t in r.json()["texts"]] == list(range(len(texts))) and len(texts) == 2
    if doc == "docs/chunks.md":  # the first to register them: the answer the doc shows
        shown = re.search(r"^    (\{\"texts\": \[\{\"index\".*)$", (ROOT / doc).read_text(), re.M).group(1)
        assert r.json() == json.loads(shown)


@pytest.mark.server
def test_the_documented_separator_request_is_served_and_a_bad_body_names_no_source_file(server):
    (headers, body), = curls("docs/chunks.md", "/generate")
    r = send(server, "/generate", headers, body)
    assert r.status_code == 200 and len(r.json()["meta_info"]["mepic_chunks"]) == 2, r.text
    bad = send(server, "/generate", {}, body)  # the example as it was: no content-type
    assert bad.status_code == 400, bad.text
    assert "http_server.py" not in bad.text and 'File "' not in bad.text, bad.text


@pytest.mark.server
def test_the_warm_commands_docstring_examples_run_as_written(server, tmp_path, monkeypatch, capsys):
    """Each example line of the docstring, its files made in a folder of their own and --url pointed at the
    test's server. The first example named docs/, which in this checkout documents chunk markup: refused."""
    examples = re.findall(r"^    python -m sglang_mepic\.launch\.warm (.*?)(?:\s+#.*)?$", warm.__doc__, re.M)
    assert len(examples) == 3, examples
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "one.txt").write_text("One. " + DOC)
    (tmp_path / "corpus" / "two.md").write_text("Two. " + DOC)
    (tmp_path / "corpus.jsonl").write_text(json.dumps({"text": "Three. " + DOC}) + "\n")
    (tmp_path / "a.txt").write_text("Four. " + DOC)
    (tmp_path / "b.txt").write_text("Five. " + DOC)
    for example in examples:
        args = example.split()
        if "--url" in args:
            args[args.index("--url") + 1] = server.url
        else:
            args += ["--url", server.url]
        assert warm.main(args) == 0, (example, capsys.readouterr().err)
        out = capsys.readouterr().out
        assert re.search(r"\d documents: \d new, \d known already; chunks", out), (example, out)


@pytest.mark.server
@pytest.mark.parametrize("prompt", ["", "  \n"])
@pytest.mark.parametrize("stream", [False, True])
def test_an_empty_ollama_generate_is_the_load_model_request(server, prompt, stream):
    r = requests.post(server.url + "/api/generate", timeout=60,
                      json={"model": "m", "prompt": prompt, "stream": stream})
    assert r.status_code == 200, r.text
    lines = [json.loads(line) for line in r.text.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0]["done"] is True and lines[0]["response"] == "", r.text
    chunk = requests.post(server.url + "/api/generate", timeout=60,
                          json={"model": "m", "prompt": "<|chunk|> <|/chunk|>", "stream": stream})
    assert chunk.status_code == 400 and "empty chunk" in chunk.text, chunk.text  # a blank chunk is still refused
