import io

from rich.console import Console

from dockerlaunch.backends.docker.logsink import LogSink
from dockerlaunch.cli.console import RichReporter


def _sink(buf, rank, host, path):
    return LogSink(RichReporter(Console(file=buf, width=200, color_system=None)), rank, host, path)


def test_lines_are_prefixed_split_across_chunks_and_saved_as_lines(tmp_path):
    buf = io.StringIO()
    path = tmp_path / "rank1.log"
    sink = _sink(buf, 1, "gpu2", path)
    sink(b"hello wo")
    sink(b"rld\nsecond line\r\npartial")
    assert buf.getvalue() == "[1 gpu2] hello world\n[1 gpu2] second line\n"
    sink.close()
    assert buf.getvalue().endswith("[1 gpu2] partial\n")
    assert path.read_bytes() == b"hello world\nsecond line\npartial"  # a terminal's \r\n saved as \n


def test_an_unfinished_line_is_shown_after_a_second_not_held_for_its_newline():
    import time

    buf = io.StringIO()
    sink = _sink(buf, 0, "h", None)
    sink(b"done\nprogress 10%")
    sink.tick()
    assert buf.getvalue() == "[0 h] done\n"  # not yet: the rest of the line may be on its way
    time.sleep(LogSink.PARTIAL_AFTER)
    sink.tick()
    assert buf.getvalue() == "[0 h] done\n[0 h] progress 10%\n"
    sink(b" and more\n")
    sink.close()
    assert buf.getvalue().endswith("[0 h]  and more\n")


def test_markup_in_log_lines_is_printed_as_is():
    buf = io.StringIO()
    sink = _sink(buf, 0, "h", None)
    sink(b"[bold]not markup[/bold] \xff\n")
    assert buf.getvalue() == "[0 h] [bold]not markup[/bold] \ufffd\n"
