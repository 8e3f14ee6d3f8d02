"""`dockerlaunch --help` fits one screen, grouped by what a user came to do, each command said in a line that ends
where it ends (click's own short help cut them mid-sentence: `exec  Run a command in one rank's container, e.g.`)."""

import subprocess
import sys

from dockerlaunch.cli.main import SECTIONS, cli, main  # noqa: F401


def _help() -> str:
    r = subprocess.run([sys.executable, "-m", "dockerlaunch", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_the_help_is_one_screen_of_groups():
    out = _help()
    lines = out.splitlines()
    assert len(lines) <= 40, out
    for title in ("Launch:", "Images:", "Distribution:", "Diagnostics:", "Render:", "Cluster:"):
        assert title in lines, out
    assert "Other:" not in lines, out  # every command has its place in SECTIONS
    assert not any(line.rstrip().endswith(("...", "e.g.", ",")) for line in lines[1:]), out  # [ARGS]... aside
    assert all(len(line) <= 100 for line in lines), out


def test_every_command_is_in_one_section_and_every_section_names_a_command():
    import click

    from dockerlaunch.cli import diagnose, images, jobs, render, sim, transfer  # noqa: F401 - registers commands

    listed = [name for _, rows in SECTIONS for name, _ in rows]
    assert len(listed) == len(set(listed))
    registered = set(cli.list_commands(click.Context(cli)))
    assert set(listed) == registered, (set(listed) - registered, registered - set(listed))


# What each command reads of the shared config options (cli/main.py: target_options, job_ref_options,
# config_options): a command lists an option in its --help only where it uses it (`logs --mount` did nothing).
TARGET = {"--config", "--hosts"}
JOB_REF = TARGET | {"--name"}
SHAPE = JOB_REF | {"--image", "--nproc-per-node", "--master-port", "--mount", "--env"}
READS = {
    "up": SHAPE, "doctor": SHAPE, "render": SHAPE, "commtest": SHAPE, "config show": SHAPE,
    "down": JOB_REF, "status": JOB_REF, "logs": JOB_REF, "exec": JOB_REF, "dump": JOB_REF, "transport": JOB_REF,
    "ps": TARGET, "push": TARGET | {"--image"}, "load": TARGET, "build": TARGET, "wheels build": {"--config"},
    # the sim's commands: --name is the simulated cluster's
    "sim up": {"--name"}, "sim down": {"--name"}, "sim shape": {"--name"}, "sim status": {"--name"},
}


def _commands(cmd, path=()):
    import click

    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(click.Context(cmd)):
            yield from _commands(cmd.get_command(click.Context(cmd), name), (*path, name))
    else:
        yield " ".join(path), cmd


def test_each_command_declares_only_the_config_options_it_reads():
    import click

    from dockerlaunch.cli import diagnose, images, jobs, render, sim, transfer  # noqa: F401 - registers commands

    wrong = {}
    for path, cmd in _commands(cli):
        options = {o for p in cmd.params if isinstance(p, click.Option) for o in p.opts} & SHAPE
        if options != READS.get(path, set()):
            wrong[path] = sorted(options)
    assert wrong == {}, wrong


def test_stacks_list_marks_the_recommended_stack():
    """Quoted: `stacks list` did not mark the recommended stack (no field said which it is)."""
    from dockerlaunch.images.stacks import load_matrix

    recommended = load_matrix().recommended
    assert recommended
    r = subprocess.run([sys.executable, "-m", "dockerlaunch", "stacks", "list"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    [marked] = [line for line in r.stdout.splitlines() if line.startswith("* ")]
    assert marked.split()[1] == recommended and "[recommended" in marked, marked


def test_a_printed_command_repeats_the_plan_flags_its_command_takes():
    """job/invocation.py's TAKES is what each command's options are: a hint to doctor that repeated --push would
    fail when pasted, one that dropped --image checked another image."""
    import click

    from dockerlaunch.cli import diagnose, images, jobs, render, sim, transfer  # noqa: F401 - registers commands
    from dockerlaunch.job.invocation import PLAN_FLAGS, TAKES

    commands = dict(_commands(cli))
    for path, takes in TAKES.items():
        options = {o for p in commands[path].params if isinstance(p, click.Option) for o in p.opts}
        assert options & set(PLAN_FLAGS) == takes, path
    shaped = {path for path, reads in READS.items() if reads == SHAPE}
    assert shaped == set(TAKES), shaped ^ set(TAKES)  # a command that shapes the plan is in TAKES


def _command_help(*words: str) -> str:
    import os

    r = subprocess.run([sys.executable, "-m", "dockerlaunch", *words, "--help"], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_up_and_render_help_fit_a_screen_with_their_options_under_headings():
    """Quoted: `up --help` was 55 lines and `render --help` 58, one list of options (at 80 columns)."""
    for words, headings in ((("up",), ("Job:", "Run:", "After a failure:", "Output:")),
                            (("render",), ("Job:", "Target:", "Output:"))):
        out = _command_help(*words)
        lines = out.splitlines()
        assert len(lines) <= 40, out
        assert [line for line in lines if line.endswith(":") and not line.startswith(" ")] == list(headings), out
        assert "Other:" not in lines and "Options:" not in lines, out
        assert all(len(line) <= 80 for line in lines), out
    assert "--push" in _command_help("up") and "--namespace NS" in _command_help("render")  # a target's own flag


def test_ps_help_shows_its_json_keys_and_points_to_nothing_pip_leaves_out():
    """Quoted: `ps --help` pointed to docs/CLI-JSON.md, which `pip install .` does not install."""
    out = _command_help("ps")
    assert "docs/" not in out and '"unanswered": [{"host", "error"}]' in out, out
    assert all(len(line) <= 80 for line in out.splitlines()), out
