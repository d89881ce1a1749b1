"""The differential behind the tests that a request's output does not depend on the cache or the
schedule: each request answered among others (on a cache they warm, batched with them), and again
alone on an empty cache (a flush before each: what a fresh server holds)."""

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

import requests

Item, Answer = TypeVar("Item"), TypeVar("Answer")


def flush(url: str) -> None:
    assert requests.post(url + "/flush_cache", timeout=60).status_code == 200


def alone(url: str, items: list[Item], send: Callable[[Item], Answer]) -> list[Answer]:
    """Each item sent by itself, on an empty cache."""
    out = []
    for item in items:
        flush(url)
        out.append(send(item))
    return out


def together(items: list[Item], send: Callable[[Item], Answer], workers: int, gap_s: float = 0.0) -> list[Answer]:
    """The items sent at once from `workers` threads, the i-th `i * gap_s` after the first."""
    def staggered(i):
        time.sleep(i * gap_s)
        return send(items[i])

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(staggered, range(len(items))))


def warm_then_alone(url: str, items: list[Item], send: Callable[[Item], Answer],
                    workers: int = 4) -> tuple[list[Answer], list[Answer]]:
    """(answers among the others from an empty cache, each alone)."""
    flush(url)
    warm = together(items, send, workers)
    return warm, alone(url, items, send)
