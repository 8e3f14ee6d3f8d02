"""Heartbeat bookkeeping: a host is lost after `timeout` seconds of silence counted in the launcher's running
time; a launcher that stood still (starved by its own log streams) accuses nobody."""

from dockerlaunch.backends.docker.watchdog import STALL, TICK, Silence, _Peer


def peers(n):
    return [_Peer(host=f"h{i}", chan=None, last_answer=0.0) for i in range(n)]


def run(sil, ps, start, end, answering, step=TICK):
    """The beat loop from `start` to `end`: hosts in `answering` answer every beat; beats every 2 s."""
    t, next_beat = start, start
    while t <= end:
        for i, p in enumerate(ps):
            if i in answering and p.unanswered_since is not None:
                Silence.answered(p, t)
        sil.tick(t, ps)
        if t >= next_beat:
            next_beat = t + 2.0
            for p in ps:
                Silence.sent(p, t)
        t = round(t + step, 3)
    return t - step


def test_a_silent_host_is_lost_after_the_timeout_and_only_it():
    ps, sil = peers(3), Silence(0.0)
    run(sil, ps, 0.0, 9.8, answering={0, 1})
    assert sil.lost(9.8, ps, 10) == []  # the first unanswered beat went out at 0.0: 9.8 s of silence
    t = run(sil, ps, 10.0, 12.0, answering={0, 1})
    assert [p.host for p in sil.lost(t, ps, 10)] == ["h2"]


def test_a_launcher_stall_is_not_counted_against_any_host():
    ps, sil = peers(4), Silence(0.0)
    t = run(sil, ps, 0.0, 5.0, answering={0, 1, 2, 3})
    # the launcher stands still for 30 s (nothing read, nothing sent); the hosts' answers wait in buffers
    assert sil.lost(t + 30, ps, 10) == []  # asked while the beat loop is behind: no verdict
    # it runs again before its SSH threads have read the answers: still nobody is lost
    t = run(sil, ps, t + 30, t + 31, answering=set())
    assert sil.lost(t, ps, 10) == []
    # answers that arrive late after the stall still count; a host that truly stopped is still found
    t = run(sil, ps, t + TICK, t + 12, answering={0, 1, 2})
    assert [p.host for p in sil.lost(t, ps, 10)] == ["h3"]


def test_a_stall_that_is_only_part_of_the_silence_still_lets_the_host_be_lost():
    ps, sil = peers(2), Silence(0.0)
    t = run(sil, ps, 0.0, 6.0, answering={0})  # h1 silent since 0.0
    t = run(sil, ps, t + 20, t + 21, answering={0})  # a 20 s stall: counts as nothing
    assert sil.lost(t, ps, 10) == []  # h1 has been silent ~7 s of running time
    t = run(sil, ps, t + TICK, t + 4, answering={0})
    assert [p.host for p in sil.lost(t, ps, 10)] == ["h1"]


def test_small_scheduling_jitter_is_not_a_stall():
    ps, sil = peers(1), Silence(0.0)
    run(sil, ps, 0.0, 12.0, answering=set(), step=TICK + STALL * 0.9)  # a slow but running loop
    assert [p.host for p in sil.lost(12.0, ps, 10)] == ["h0"]
