"""push's progress bars (issue 58, item 6): each bar is one phase's bytes at that phase's own rate. A stream bar that
counted a 4 kB stream over the host's docker load after it showed 431 bytes/s; the cache's fill had no bar at all.

The console's clock is a fake one, moved by hand: rates are computed, never timed."""

import io

from rich.console import Console

from dockerlaunch.cli.console import RichReporter


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def shown(clock: Clock, phases) -> str:
    out = Console(file=io.StringIO(), width=140, force_terminal=False, get_time=clock)
    with RichReporter(out).progress() as bars:
        phases(bars)
    return out.file.getvalue()


def test_a_stream_keeps_its_own_rate_while_the_host_loads_after_its_last_byte():
    clock = Clock()

    def phases(bars):
        bar = bars.add("h1", 4000)  # the plan's bytes: the rate counts from the bar's start
        for _ in range(4):
            clock.now += 0.5
            bar.advance(1000)
        bar.phase("sent; docker load on the host")
        clock.now += 30  # the host's docker load: no byte moves
        bar.done("pushed")

    line = shown(clock, phases)
    assert "h1 pushed" in line and "4.0/4.0 kB" in line and "2.0 kB/s" in line, line


def test_a_bar_that_counted_more_than_its_estimate_ends_at_what_it_counted_and_a_failed_one_where_it_stopped():
    clock = Clock()

    def phases(bars):
        ok, cut = bars.add("h1", 1000), bars.add("h2", 10_000_000)
        clock.now += 1
        ok.advance(3000)  # tar headers, config and manifest beside a 1 kB layer
        cut.advance(4_000_000)
        ok.done("pushed")
        cut.done("failed", ok=False)

    text = shown(clock, phases)
    assert "h1 pushed" in text and "3.0/3.0 kB" in text and "3.0 kB/s" in text, text
    assert "h2 failed" in text and "4.0/10.0 MB" in text and "4.0 MB/s" in text, text


def test_a_phase_that_waits_before_its_first_byte_is_as_slow_as_it_was():
    """docker save on Docker 20.10 writes the image to a folder before its first byte: that is the save's time."""
    clock = Clock()

    def phases(bars):
        bar = bars.add("docker save (for the layer map)", 2_000_000)
        clock.now += 9
        bar.advance(2_000_000)
        clock.now += 1
        bar.done("done")

    text = shown(clock, phases)
    assert "2.0/2.0 MB" in text and "222.2 kB/s" in text, text  # 2 MB in 9 s


def test_the_rate_a_bar_ends_with_is_its_whole_phase_however_many_chunks_it_counted():
    """rich keeps the last 1000 samples: 1200 chunks after a 9 s wait would read as the chunks' rate alone."""
    clock = Clock()

    def phases(bars):
        bar = bars.add("h1", 1_200_000)
        clock.now += 9
        for _ in range(1200):
            clock.now += 0.001
            bar.advance(1000)
        bar.done("pushed")

    text = shown(clock, phases)
    assert "1.2/1.2 MB" in text and "117.6 kB/s" in text, text  # 1.2 MB in 10.2 s
