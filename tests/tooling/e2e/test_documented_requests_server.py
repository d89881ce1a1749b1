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
from pathlib import Path

import pytest
import requests

from sglang_mepic.launch import warm
from sglang_mepic.process.server_process import ServerProcess
from support.documented_requests import DOC


ROOT = Path(__file__).resolve().parents[3]


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


def test_the_documented_separator_request_is_served_and_a_bad_body_names_no_source_file(server):
    (headers, body), = curls("docs/chunks.md", "/generate")
    r = send(server, "/generate", headers, body)
    assert r.status_code == 200 and len(r.json()["meta_info"]["mepic_chunks"]) == 2, r.text
    bad = send(server, "/generate", {}, body)  # the example as it was: no content-type
    assert bad.status_code == 400, bad.text
    assert "http_server.py" not in bad.text and 'File "' not in bad.text, bad.text


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
