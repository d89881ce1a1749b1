"""Helpers and fixtures shared by test modules (which never import one another), moved out of
tests/frontend/e2e/test_chunk_api.py."""

import requests


def post(server, path, body, expect=200):
    r = requests.post(server.url + path, json=body, timeout=120)
    assert r.status_code == expect, r.text
    return r.json()
