"""Where the pool's pages go during a probe: eval.experiments.run's sampler reads /server_info's `page_anatomy`
(sglang_mepic/pages/anatomy.py: each used page in exactly one category), and this module keeps, per
probe, the sample at the peak, the time mean of each category and a short series for the plot; then
the table at each cell's capacity point and the stacked plot over time, one panel per system.
"""

import statistics
from pathlib import Path

# The categories, in the order they stack (bottom first), with the words the table and plot use.
CATEGORIES = {
    "private": "private to a request",
    "shared_prefix": "prefix shared by requests",
    "compile_rows": "compile rows in flight",
    "chunk_read_1": "chunk, 1 reader",
    "chunk_read_2_4": "chunk, 2-4 readers",
    "chunk_read_5_plus": "chunk, 5+ readers",
    "chunk_pinned": "chunk, held for a waiting request",
    "held_unread": "held, no reader",
    "chunk_evictable": "chunk, evictable",
    "prefix_evictable": "prefix, evictable",
}
SERIES_POINTS = 40  # samples kept per probe for the plot (results.json stays small)


def in_pages(sample: dict, page_size: int) -> dict:
    """A /server_info sample in pages of `page_size` tokens: the server counts in its allocator's pages, and
    SGLang's own cache (vanilla) runs at page size 1, so its counts are tokens. Systems compare in one unit."""
    scale = sample.get("page_size", page_size) / page_size
    if scale == 1:
        return sample
    return {k: (round(v * scale, 1) if k == "used_pages" or k in CATEGORIES else v) for k, v in sample.items()}


def summarise(samples: list[dict]) -> dict:
    """A probe's anatomy: `peak` (the sample where the most pages were used), `mean` (each category over
    the samples), `series` (at most SERIES_POINTS samples: t, then the categories in CATEGORIES order) and
    `flight` (per window of the series' step: its first t, the most requests running (holding KV rows) and
    waiting in SGLang's queue in it; a server from before it said the waiting ones reads None there)."""
    if not samples:
        return {}
    peak = max(samples, key=lambda s: s.get("used_pages", 0))
    step = max(1, len(samples) // SERIES_POINTS)
    return {
        "samples": len(samples),
        "peak": {k: peak.get(k, 0) for k in ("used_pages", "pad_slots", "running_requests", *CATEGORIES)},
        "mean": {k: round(statistics.fmean(s.get(k, 0) for s in samples), 1)
                 for k in ("used_pages", "running_requests", "pad_slots", *CATEGORIES)},
        "series": [[s["t"], *(s.get(k, 0) for k in CATEGORIES)] for s in samples[::step]],
        "flight": [flight(samples[i:i + step]) for i in range(0, len(samples), step)],
    }


def flight(window: list[dict]) -> list:
    """t of the window's first sample, then the most requests running and waiting in it: a short queue wait
    falls between the samples a plain decimation keeps."""
    waiting = [s["waiting_requests"] for s in window if s.get("waiting_requests") is not None]
    return [window[0]["t"], max(s.get("running_requests", 0) for s in window), max(waiting) if waiting else None]


def table(rows: list[tuple[str, int, dict]], stat: str = "peak") -> str:
    """One line per (label, pool, anatomy): with `peak` the sample with the most pages used (a capacity point),
    with `mean` each figure's time mean over the probe (a matched run). Running requests are the admitted
    ones, holding KV rows; pad slots, the slots of their rows that hold pads."""
    rows = [(s, pool, a) for s, pool, a in rows if a.get(stat)]
    if not rows:
        return ""
    used = "used at peak" if stat == "peak" else "used"
    head = f"| run | pool pages | {used} | running requests | " + " | ".join(CATEGORIES.values()) + " | pad slots |"
    lines = [head, "|" + "---|" * (len(CATEGORIES) + 5)]
    for label, pool, a in rows:
        x = a[stat]
        lines.append(f"| {label} | {pool:,} | {x['used_pages']} | {x.get('running_requests', '—')} | "
                     + " | ".join(str(x[k]) for k in CATEGORIES) + f" | {x.get('pad_slots', '—')} |")
    return "\n".join(lines)


def plot(panels: list[tuple[str, dict]], path: Path, title: str) -> None:
    """Stacked pages by category over a probe's time, one panel per (label, anatomy)."""
    panels = [(label, a) for label, a in panels if a.get("series")]
    if not panels:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(panels), 1, figsize=(9.5, 2.2 * len(panels) + 0.8), sharex=True, squeeze=False)
    for ax, (label, a) in zip(axes[:, 0], panels):
        series = a["series"]
        t = [row[0] for row in series]
        ax.stackplot(t, *[[row[i + 1] for row in series] for i in range(len(CATEGORIES))],
                     labels=list(CATEGORIES.values()))
        ax.set_ylabel("pages")
        ax.set_title(label, fontsize=9)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("seconds into the probe")
    axes[0, 0].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the panels, not on them
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_in_flight(panels: list[tuple[str, dict]], path: Path, title: str) -> None:
    """Requests running (holding KV rows) and waiting for admission over a probe's time, a line each, one
    panel per (label, anatomy): what the pool let each system run at once at its capacity point."""
    panels = [(label, a) for label, a in panels if a.get("flight")]
    if not panels:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 1.8 * len(panels) + 0.8), sharex=True, squeeze=False)
    top = max(max(row[1], row[2] or 0) for _, a in panels for row in a["flight"])
    for ax, (label, a) in zip(axes[:, 0], panels):
        t = [row[0] for row in a["flight"]]
        ax.plot(t, [row[1] for row in a["flight"]], label="running (holding KV)", color="tab:blue")
        if any(row[2] is not None for row in a["flight"]):
            ax.plot(t, [row[2] or 0 for row in a["flight"]], label="waiting", color="tab:red", linestyle="--")
        ax.set_ylim(0, top + 1)  # one scale for every panel: systems compare by height
        ax.set_ylabel("requests")
        ax.set_title(label, fontsize=9)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("seconds into the probe")
    axes[0, 0].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
