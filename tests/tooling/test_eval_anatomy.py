"""eval/lib/anatomy.py: a probe's page anatomy kept small (the peak sample, the means, a short series), the
table at each cell's capacity point and the stacked plot."""

from eval.lib import anatomy


def sample(t, used, **cats):
    out = {"t": t, "used_pages": used, "pad_slots": 3, "running_requests": 2, "page_size": 16}
    return out | {k: 0 for k in anatomy.CATEGORIES} | cats


def test_the_peak_is_the_sample_with_the_most_pages_used_and_the_series_stays_short():
    samples = [sample(i / 2, i % 7, private=i % 7) for i in range(200)]
    samples[50] = sample(25.0, 9, private=4, chunk_read_5_plus=5)
    a = anatomy.summarise(samples)
    assert a["samples"] == 200 and a["peak"]["used_pages"] == 9 and a["peak"]["chunk_read_5_plus"] == 5
    assert len(a["series"]) <= anatomy.SERIES_POINTS + 1
    assert all(len(row) == len(anatomy.CATEGORIES) + 1 for row in a["series"])
    assert a["mean"]["private"] == round(sum(s["private"] for s in samples) / 200, 1)
    assert anatomy.summarise([]) == {}


def test_the_table_has_a_line_per_cell_and_the_plot_a_panel_per_system(tmp_path):
    a = anatomy.summarise([sample(0, 4, private=4), sample(1, 6, private=2, chunk_evictable=4)])
    text = anatomy.table([("mepic (seed 0)", 512, a), ("epic-16 (seed 0)", 512, {})])
    lines = text.splitlines()
    assert len(lines) == 3 and lines[2].startswith("| mepic (seed 0) | 512 | 6 | 2 | 2 | 0 |")  # used, running, private
    assert lines[2].endswith("| 3 |")  # pad slots
    means = anatomy.table([("mepic, 8 in flight", 512, a)], "mean").splitlines()
    assert "| used | running requests |" in means[0] and means[2].startswith("| mepic, 8 in flight | 512 | 5.0 | 2.0 | 3.0 |")
    assert "chunk, evictable" in lines[0]
    anatomy.plot([("mepic", a), ("vanilla", a)], tmp_path / "anatomy.png", "test")
    assert (tmp_path / "anatomy.png").stat().st_size > 1000


def test_a_sample_counted_in_tokens_is_put_in_the_pages_every_system_is_compared_in():
    # SGLang's own cache (vanilla) runs at page size 1: its anatomy counts tokens. 22,194 of them on a pool of
    # 2,048 16-token pages read as 11x the pool before.
    tokens = sample(0, 22194, private=18160, prefix_evictable=4034) | {"page_size": 1}
    pages = anatomy.in_pages(tokens, 16)
    assert pages["used_pages"] == 1387.1 and pages["private"] == 1135.0 and pages["prefix_evictable"] == 252.1
    assert pages["pad_slots"] == 3 and pages["running_requests"] == 2 and pages["t"] == 0  # counts, not pages
    assert anatomy.in_pages(sample(0, 9, private=9), 16) == sample(0, 9, private=9)


def test_the_requests_in_flight_are_kept_beside_the_pages_and_plotted(tmp_path):
    samples = [sample(i, 5, private=5) | {"running_requests": i % 4, "waiting_requests": 3 - i % 4} for i in range(90)]
    a = anatomy.summarise(samples)
    assert len(a["flight"]) == len(a["series"]) and a["flight"][1] == [2, 3, 1]  # t, then the window's most
    samples[51]["waiting_requests"] = 9  # a wait between the kept samples still shows
    assert max(row[2] for row in anatomy.summarise(samples)["flight"]) == 9
    old = anatomy.summarise([sample(0, 4, private=4)])  # a server that did not say how many wait
    assert old["flight"] == [[0, 2, None]]
    anatomy.plot_in_flight([("mepic", a), ("vanilla", old), ("epic-16", {})], tmp_path / "f.png", "test")
    assert (tmp_path / "f.png").stat().st_size > 1000
