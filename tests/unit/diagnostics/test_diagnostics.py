"""The pure halves of the diagnostics: NCCL log parsing and transport verdicts, py-spy grouping, rank discovery,
commtest's sizes, link speeds and verdicts. Fixtures under data/ were recorded, not written:
- data/nccl/{p2p,shm,socket}: NCCL 2.28.9 INFO logs (NCCL_DEBUG_SUBSYS=INIT,NET) of 2 ranks on one 2 x H200 host,
  torch 2.11, by scripts/record-nccl-logs on the device machine: default (P2P/CUMEM), NCCL_P2P_DISABLE=1 (SHM),
  NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 (the ranks talk through NET/Socket on one host, the private-IPC symptom).
- data/hang: py-spy dumps of the same machine's NCCL hang (rank 1 sleeps) and PyTorch's fr_trace of it;
  data/hang/gloo: `dockerlaunch dump` of a 3-host sim job (gloo) where rank 1 sleeps.
"""

import io
import tarfile
from pathlib import Path

import pytest

from dockerlaunch.diagnostics import commtest as ct
from dockerlaunch.diagnostics.callstacks import RankStack, parse_pyspy, ranges, summary
from dockerlaunch.diagnostics.dump import parse_ranks, safe_extract, split_marked
from dockerlaunch.diagnostics.nccl_logs import split_files
from dockerlaunch.diagnostics.transport import describe, judge, parse_hosts, parse_log, path_kind
from dockerlaunch.errors import ConfigError

DATA = Path(__file__).resolve().parents[1] / "data"


def recorded(variant: str) -> list[str]:
    return [p.read_text() for p in sorted((DATA / "nccl" / variant).glob("*.log"))]


# ---------------------------------------------------------------- transport: recorded logs


@pytest.mark.parametrize("variant,intra", [("p2p", ["P2P/CUMEM"]), ("shm", ["SHM"]), ("socket", ["NET/Socket"])])
def test_recorded_logs_give_the_intra_host_path(variant, intra):
    [t] = parse_hosts({"gpu-a": recorded(variant)})
    assert t.processes == 2 and t.version == "2.28.9+cuda13.0"
    assert t.network == ["Socket"] and t.sockets == ["eth0"] and t.ib_none and t.gdrdma is False
    assert t.intra == intra and t.inter == []


def test_same_host_ranks_over_the_network_warn_and_the_good_cases_do_not():
    for variant in ("p2p", "shm"):
        [t] = parse_hosts({"gpu-a": recorded(variant)})
        assert judge(t, None, multi_host=False) == [], variant
    [t] = parse_hosts({"gpu-a": recorded("socket")})
    # NCCL itself reports nNodes 2 here: only the hostnames say both ranks share the machine
    assert t.same_host_net and t.same_host_net[0].endswith("via NET/Socket/0")
    [w] = judge(t, None, multi_host=False)
    assert w.verdict == "WARN" and "ranks on this host talk through the network" in w.detail
    [w] = judge(t, None, multi_host=False, ipc="private")
    assert "ipc: host" in w.detail
    assert "intra-host NET/Socket" in describe(t)


def test_describe_of_the_good_case():
    [t] = parse_hosts({"gpu-a": recorded("p2p")})
    assert describe(t) == "network Socket (eth0); GDRDMA no; intra-host P2P/CUMEM; inter-host -"


def test_single_host_socket_network_is_not_an_ib_fallback():
    [t] = parse_hosts({"gpu-a": recorded("p2p")})
    assert judge(t, ["mlx5_0:1"], multi_host=False) == []  # one host: NCCL's network carries nothing


# ---------------------------------------------------------------- transport: two hosts, InfiniBand

# Lines in the shape NCCL 2.2x prints them (`NET/IB : Using [0]mlx5_0:1/IB ... ; OOB`, `[send] via NET/IB/0/GDRDMA`),
# as in public multi-node logs (e.g. siderolabs/docs#566, NVIDIA/nccl#707); hosts and ranks are this test's own.
def ib_log(host: str, pid: int, rank: int, net: str = "IB", gdr: bool = True, local: int = 2) -> str:
    p = f"{host}:{pid}:{pid} [{rank % 2}] NCCL"
    peer = rank + 2 if rank < 2 else rank - 2
    lines = [f"{p} INFO NCCL version 2.21.5+cuda12.4"]
    if net == "IB":
        lines += [f"{p} INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]; OOB ib0:10.0.0.{rank}<0>",
                  f"{p} INFO Using network IB"]
    else:
        lines += [f"{p} INFO NET/IB : No device found.", f"{p} INFO NET/Socket : Using [0]eth0:10.0.0.{rank}<0>",
                  f"{p} INFO Using network Socket"]
    lines += [
        f"{p} INFO ncclCommInitRank comm 0x55{rank} rank {rank} nranks 4 cudaDev {rank % 2} nvmlDev {rank % 2} "
        f"busId 1000 commId 0xabc - Init START",
        f"{p} INFO comm 0x55{rank} rank {rank} nRanks 4 nNodes 2 localRanks {local} localRank {rank % 2} MNNVL 0",
        f"{p} INFO Channel 00/0 : {rank}[{rank % 2}] -> {rank ^ 1}[{(rank ^ 1) % 2}] via P2P/IPC/read",
    ]
    via = f"NET/IB/{rank % 2}" + ("/GDRDMA" if gdr else "") if net == "IB" else "NET/Socket/0"
    lines += [f"{p} INFO Channel 01/0 : {rank}[{rank % 2}] -> {peer}[{peer % 2}] [send] via {via}",
              f"{p} INFO Channel 01/0 : {peer}[{peer % 2}] -> {rank}[{rank % 2}] [receive] via {via}"]
    return "\n".join(lines) + "\n"


def two_hosts(net="IB", gdr=True):
    return parse_hosts({"a": [ib_log("node-a", 10, 0, net, gdr), ib_log("node-a", 11, 1, net, gdr)],
                        "b": [ib_log("node-b", 20, 2, net, gdr), ib_log("node-b", 21, 3, net, gdr)]})


def test_ib_with_gdrdma_across_two_hosts():
    a, b = two_hosts()
    assert a.network == ["IB"] and a.hcas == ["mlx5_0:1/IB", "mlx5_1:1/IB"] and a.gdrdma is True
    assert a.intra == ["P2P/IPC"] and a.inter == ["NET/IB"] and not a.same_host_net
    assert describe(b) == ("network IB (mlx5_0:1/IB, mlx5_1:1/IB); GDRDMA yes; intra-host P2P/IPC; "
                           "inter-host NET/IB")
    assert judge(a, ["mlx5_0:1", "mlx5_1:1"], multi_host=True) == []


def test_ib_without_gdr_says_no():
    a, _ = two_hosts(gdr=False)
    assert a.gdrdma is False and a.inter == ["NET/IB"]


def test_socket_fallback_beside_active_ib_ports_fails_and_names_the_cause():
    a, _ = two_hosts(net="Socket")
    assert a.inter == ["NET/Socket"] and a.intra == ["P2P/IPC"] and not a.same_host_net
    [f] = judge(a, ["mlx5_0:1"], multi_host=True)
    assert f.verdict == "FAIL" and "TCP sockets although InfiniBand port(s) mlx5_0:1 are ACTIVE" in f.detail
    assert "no InfiniBand device in the container" in f.detail
    assert judge(a, [], multi_host=True) == []  # no ACTIVE ports seen: sockets are all there is
    assert judge(a, None, multi_host=True) == []


def test_missing_libibverbs_is_named_as_the_cause():
    log = ib_log("node-a", 10, 0, "Socket") + "node-a:10:10 [0] NCCL WARN Failed to open libibverbs.so[.1]\n"
    [t, _] = parse_hosts({"a": [log], "b": [ib_log("node-b", 20, 2, "Socket")]})
    assert t.ibverbs_missing and "NCCL WARN" not in t.nccl_warnings[0]
    [f] = judge(t, ["mlx5_0:1"], multi_host=True)
    assert "could not load libibverbs" in f.detail


def test_plugin_network_and_path_kinds():
    assert path_kind("NET/IBext_v8/2") == "NET/IBext_v8" and path_kind("SHM/direct/direct") == "SHM"
    assert path_kind("P2P/CUMEM/read") == "P2P/CUMEM" and path_kind("NET/IB/0/GDRDMA") == "NET/IB"
    log = parse_log("h:1:1 [0] NCCL INFO Using network AWS Libfabric\nnot an NCCL line\n")
    assert log.networks == ["AWS Libfabric"] and log.lines == 1


def test_nothing_seen_is_said_so():
    [t] = parse_hosts({"a": []})
    assert not t.seen and describe(t) == "no NCCL transport lines yet" and judge(t, ["x:1"], multi_host=True) == []


def test_nccl_logs_script_output_splits_per_file():
    text = "==> /d/nccl/nccl.a.1.log\nline1\nline2\n==> /d/nccl/nccl.a.2.log\nline3\n"
    assert split_files(text) == ["line1\nline2", "line3"]
    assert split_files("") == []


def test_the_log_filter_keeps_every_line_the_parser_reads():
    """nccl_logs.sh greps the logs on the host; a line it drops is a verdict lost."""
    import shutil
    import subprocess
    import tempfile

    from dockerlaunch.diagnostics import script

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "nccl").mkdir()
        for p in (DATA / "nccl" / "socket").glob("*.log"):
            shutil.copy(p, Path(d) / "nccl" / f"nccl.0.vm.{p.stem}.log")  # as host 0's container names them
        (Path(d) / "nccl" / "nccl.1.vm.7.log").write_text("vm:7:7 [0] NCCL INFO Using network IB\n")  # host 1's
        out = subprocess.run(["sh", "-c", script("nccl_logs.sh"), "sh", d, "0"], capture_output=True, text=True,
                             check=True).stdout
        every = subprocess.run(["sh", "-c", script("nccl_logs.sh"), "sh", d], capture_output=True, text=True,
                               check=True).stdout
    assert "Using network IB" not in out and "Using network IB" in every  # only the asked host's files
    assert len(out) < sum(len(x) for x in recorded("socket"))  # it does filter
    filtered = parse_hosts({"h": split_files(out)})[0]
    full = parse_hosts({"h": recorded("socket")})[0]
    assert filtered.to_dict() == full.to_dict()


# ---------------------------------------------------------------- stacks


def gloo_stacks() -> list[RankStack]:
    d = DATA / "hang" / "gloo"
    return [RankStack(r, f"10.0.0.{r // 2 + 1}", parse_pyspy((d / f"rank{r}.pyspy.txt").read_text())) for r in range(6)]


def test_the_odd_rank_is_named_with_its_host_and_line():
    lines = summary(gloo_stacks())
    assert lines == ["5 ranks (0,2-5) in all_reduce at hang.py:6 (in wait_for_peers), idle",
                     "odd one out: rank 1 (10.0.0.1) in main at hang.py:15, idle"]


def test_nccl_hang_recorded_on_gpus():
    d = DATA / "hang"
    s0 = RankStack(0, "gpu-a", parse_pyspy((d / "pyspy.866.txt").read_text()))
    s1 = RankStack(1, "gpu-a", parse_pyspy((d / "pyspy.867.txt").read_text()))
    assert s0.describe() == "synchronize at hang.py:7 (in step)"
    assert s1.describe() == "main at hang.py:17, idle"
    native = RankStack(1, "gpu-a", parse_pyspy((d / "pyspy-native.867.txt").read_text()))
    assert native.describe() == "main at hang.py:17, idle"  # C frames are skipped when naming the place
    assert "missing ranks: {1}" in (d / "fr_trace.txt").read_text()  # what the analyzer itself said


def test_native_frames_group_like_python_ones():
    d = DATA / "hang" / "gloo"
    native = RankStack(0, "h", parse_pyspy((d / "rank0.native.pyspy.txt").read_text()))
    assert native.describe() == "all_reduce at hang.py:6 (in wait_for_peers), idle"


def test_no_majority_lists_every_rank_and_errors_group():
    d = DATA / "hang"
    a = RankStack(0, "a", parse_pyspy((d / "pyspy.866.txt").read_text()))
    b = RankStack(1, "b", parse_pyspy((d / "pyspy.867.txt").read_text()))
    assert summary([a, b]) == ["rank 0 (a) in synchronize at hang.py:7 (in step)",
                               "rank 1 (b) in main at hang.py:17, idle"]
    broken = RankStack(2, "c", [], error="Permission denied")
    assert broken.describe() == "no stack (Permission denied)"
    assert summary([]) == ["no rank processes found"]


@pytest.mark.parametrize("ranks,text", [([0, 1, 2, 5, 7, 8], "0-2,5,7-8"), ([3], "3"), ([2, 1], "1-2"), ([], "")])
def test_ranges(ranks, text):
    assert ranges(ranks) == text


# ---------------------------------------------------------------- dump: rank processes, files


def test_rank_processes_recorded_in_the_sim():
    procs = parse_ranks((DATA / "hang" / "gloo" / "processes.txt").read_text())
    assert [(p.pid, p.rank, p.local_rank) for p in procs] == [(11, 0, "0"), (12, 1, "1")]


def test_dataloader_workers_inherit_rank_but_are_not_ranks():
    text = ("proc 40 7 3 1 python train.py\n"
            "proc 38 40 3 1 python train.py\n"  # a DataLoader worker (pids wrapped): same RANK, parent is the rank
            "proc 41 7 2 0 python train.py\n"
            "garbage line\n")
    assert [(p.pid, p.rank) for p in parse_ranks(text)] == [(41, 2), (40, 3)]


def test_split_marked():
    assert split_marked("==> pid 11\nThread 11\n==> pid 12\n") == {11: "Thread 11\n", 12: "\n"}


def tar_of(*members) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind == tarfile.SYMTYPE:
                info.linkname = "/etc/passwd"
            info.size = len(data) if kind == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
    return buf.getvalue()


def test_safe_extract_keeps_files_and_drops_escapes_and_links(tmp_path):
    data = tar_of(("fr/rank_0", tarfile.REGTYPE, b"x"), ("../evil", tarfile.REGTYPE, b"y"),
                  ("/abs", tarfile.REGTYPE, b"z"), ("nccl/link", tarfile.SYMTYPE, b""))
    assert safe_extract(data, tmp_path / "out") == ["fr/rank_0"]
    assert (tmp_path / "out" / "fr" / "rank_0").read_bytes() == b"x"
    assert not (tmp_path / "evil").exists() and not (tmp_path / "out" / "nccl" / "link").exists()


# ---------------------------------------------------------------- commtest


@pytest.mark.parametrize("text,lo,hi", [("1M:1G", 1 << 20, 1 << 30), ("256K", 256 << 10, 256 << 10),
                                        ("64:128k", 64, 128 << 10), ("8MB:16mb", 8 << 20, 16 << 20)])
def test_sizes(text, lo, hi):
    assert ct.parse_sizes(text) == (lo, hi)


@pytest.mark.parametrize("bad", ["1G:1M", "abc", "1T", "2", "1M:32G", ""])
def test_bad_sizes_are_one_line_errors(bad):
    with pytest.raises(ConfigError, match="--sizes"):
        ct.parse_sizes(bad)


def test_links_from_sys():
    link = ct.parse_links("nic=100000\nib=mlx5_0:1 400 Gb/sec (4X NDR)\nib=mlx5_1:1 400 Gb/sec (4X NDR)\n", "ib0")
    assert link.nic_mbps == 100000 and link.ib_gbps == 800 and len(link.ib_ports) == 2
    assert ct.parse_links("nic=-1\n", "eth0").nic_mbps is None  # virtual NICs report -1
    assert ct.parse_links("nic=\n", "eth0").nic_mbps is None


def test_expectation_is_the_slowest_hosts_link():
    fast = ct.parse_links("nic=100000\nib=mlx5_0:1 400 Gb/sec (4X NDR)\n", "eth0")
    slow = ct.parse_links("nic=10000\nib=mlx5_0:1 200 Gb/sec (4X HDR)\n", "eth0")
    ib = ct.expectation([fast, slow], "IB")
    assert ib.gbs == 25 and "200 Gb/s InfiniBand" in ib.what
    tcp = ct.expectation([fast, slow], "Socket")
    assert tcp.gbs == 1.25 and tcp.what == "10 Gb/s eth0"
    assert ct.expectation([fast, ct.parse_links("nic=-1\n", "eth0")], "Socket") is None


def rows(busbw, wrong=0):
    return [{"bytes": 1 << 20, "busbw": busbw / 4, "wrong": 0}, {"bytes": 1 << 30, "busbw": busbw, "wrong": wrong}]


@pytest.mark.parametrize("busbw,status", [(20.0, "PASS"), (15.0, "PASS"), (10.0, "WARN"), (5.0, "FAIL")])
def test_verdict_against_the_link(busbw, status):
    v = ct.judge(rows(busbw), 2, "nccl", ct.Expectation(25.0, "200 Gb/s InfiniBand"), None)
    assert v.status == status and f"{busbw:.2f} GB/s at 1G" in v.reason and "200 Gb/s InfiniBand" in v.reason


def test_verdict_wrong_results_one_host_and_unknown_link():
    assert ct.judge(rows(20.0, wrong=3), 2, "nccl", ct.Expectation(25.0, "x"), None).status == "FAIL"
    assert ct.judge(rows(20.0), 1, "nccl", None, None).status == "INFO"
    assert ct.judge(rows(20.0), 2, "nccl", None, None).status == "INFO"
    assert ct.judge([], 2, "gloo", None, None).status == "FAIL"
    assert "gloo on CPU" in ct.judge(rows(1.0), 2, "gloo", ct.Expectation(1.25, "10 Gb/s eth0"), None).reason


def test_verdict_fails_on_an_ib_fallback_whatever_the_speed():
    from dockerlaunch.diagnostics.nccl_logs import TransportReport

    a, b = two_hosts(net="Socket")
    report = TransportReport([(0, "a", a, None), (1, "b", b, None)], judge(a, ["mlx5_0:1"], multi_host=True))
    v = ct.judge(rows(1.2), 2, "nccl", ct.Expectation(1.25, "10 Gb/s eth0"), report)
    assert v.status == "FAIL" and "TCP sockets" in v.reason


def pair(i, j, busbw):
    r = ct.Result([], {}, [{"bytes": 1 << 22, "busbw": busbw, "wrong": 0}], None, [], ct.SweepVerdict("PASS", ""), 0)
    return ct.PairResult((i, j), r)


def test_the_host_in_every_slow_pair_is_the_suspect():
    assert ct.suspects([pair(0, 1, 0.47), pair(0, 2, 0.024), pair(1, 2, 0.024)], 3) == [2]
    assert ct.suspects([pair(0, 1, 0.5), pair(0, 2, 0.5), pair(1, 2, 0.48)], 3) == []
    assert ct.suspects([pair(0, 1, 0.5), pair(0, 2, 0.1), pair(1, 2, 0.5), pair(2, 3, 0.5), pair(0, 3, 0.1),
                        pair(1, 3, 0.5)], 4) == [0]


def test_commtest_command_runs_the_shipped_script_under_torchrun():
    argv = ct.command(1 << 20, 1 << 30, 5)
    assert argv[:2] == ["sh", "-c"] and "--no_python python3 -c \"$0\" \"$@\"" in argv[2]
    assert "DLCOMMTEST" in argv[3] and argv[4:] == [str(1 << 20), str(1 << 30), "5"]


def test_one_file_of_several_processes_is_split_by_pid():
    both = "".join(recorded("socket"))
    [t] = parse_hosts({"gpu-a": [both]})
    assert t.processes == 2 and t.same_host_net and t.intra == ["NET/Socket"]


@pytest.mark.parametrize("section,key,value,words", [
    ("diagnostics", "nccl_log", False, "diagnostics.nccl_log is off"),
    ("container", "env", {"NCCL_DEBUG": "WARN"}, "NCCL_DEBUG=WARN hides"),
    ("container", "env", {"NCCL_DEBUG_FILE": "/tmp/nccl.log"}, "not in the job's diagnostics folder"),
])
def test_configs_that_hide_the_transport_say_why(section, key, value, words):
    from dockerlaunch.diagnostics.nccl_logs import unreadable
    from dockerlaunch.job.load import validate_config

    ok = validate_config({"hosts": ["h1"], "container": {"env": {"NCCL_DEBUG": "info"}}})
    assert unreadable(ok) is None
    bad = validate_config({"hosts": ["h1"], section: {key: value}})
    assert words in unreadable(bad)


def test_nccls_own_warnings_are_said_with_the_transport_line():
    """NCCL_DEBUG_FILE takes NCCL's WARN lines off the console: the transport report says the first few."""
    from dockerlaunch.diagnostics.nccl_logs import TransportReport, report_to
    from dockerlaunch.reporting import Reporter

    said = []

    class Capture(Reporter):
        def say(self, msg, style="bold"):
            said.append(msg)

    warn = "".join(f"h:1:1 [0] NCCL WARN NET/IB : Got completion from peer 10.0.0.2 with error {i}\n" for i in range(5))
    [t] = parse_hosts({"a": [recorded("p2p")[0] + warn]})
    report_to(Capture(), TransportReport([(0, "10.0.0.1", t, None)], []))
    assert said[0].startswith("transport rank 0 (10.0.0.1): network Socket")
    assert said[1:] == [f"transport rank 0 (10.0.0.1): NCCL WARN NET/IB : Got completion from peer 10.0.0.2 with "
                        f"error {i}" for i in range(3)]
