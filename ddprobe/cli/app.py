"""The Typer app and its root options; the commands register themselves on it."""
from __future__ import annotations

import atexit
import contextlib
import sys
from typing import Annotated

import typer
from typer.core import TyperGroup, _click

from .. import __version__
from .options import fail, out

UsageError = _click.exceptions.UsageError  # raised by typer's own copy of click
NoArgsIsHelp = _click.exceptions.NoArgsIsHelpError  # a group given no command: its help, as click shows it


def repeated_options(cmd, args: list[str]) -> list[str]:
    """The options of ``cmd`` (a click command: typer's own copy of click, so read by attribute) that ``args`` gives
    more than once (a --x/--no-x pair counts as one option), save
    those meant to repeat (``multiple``): click keeps the last silently."""
    flags: dict[str, str] = {}
    for p in cmd.params:
        if getattr(p, "param_type_name", "") == "option" and not p.multiple and not getattr(p, "count", False):
            for o in (*p.opts, *p.secondary_opts):
                flags[o] = "/".join((*p.opts, *p.secondary_opts))
    seen: dict[str, int] = {}
    for a in args:
        if a == "--":
            break
        key = a.split("=", 1)[0] if a.startswith("--") else a[:2] if a.startswith("-") and len(a) > 1 else None
        if key in flags:
            seen[flags[key]] = seen.get(flags[key], 0) + 1
    return [f for f, n in seen.items() if n > 1]


def usage_line(e, root=None) -> str:
    """A usage error (an unknown option or command, a value that does not parse, a missing argument) as one line: its
    message and where the command's options are, instead of click's usage block and boxed message."""
    msg = " ".join(e.format_message().split())
    where = getattr(getattr(e, "ctx", None), "command_path", None) or getattr(root, "command_path", None) or "ddprobe"
    return f"{msg} (see {where} --help)"


@contextlib.contextmanager
def one_line_usage(root=None):
    """A usage error raised inside as one line (``usage_line``) and exit 2; a group given no command shows its help."""
    try:
        yield
    except NoArgsIsHelp:
        raise
    except UsageError as e:
        fail(usage_line(e, root), code=2)


class Commands(TyperGroup):
    """The root group: a subcommand's option given twice is refused (one line, exit 1), never silently the last; a
    usage error is one line too (exit 2)."""

    def make_context(self, *args, **kwargs):
        with one_line_usage():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx):
        with one_line_usage(ctx):
            return super().invoke(ctx)

    def resolve_command(self, ctx, args: list[str]):
        name, cmd, rest = super().resolve_command(ctx, args)
        twice = repeated_options(cmd, rest) if cmd is not None else []
        if twice:
            fail(f"{', '.join(twice)} given more than once: give each option once (only the last would count)")
        return name, cmd, rest


app = typer.Typer(
    cls=Commands,
    name="ddprobe",
    help="Why is DDTree speculative decoding slow at long context? Probes, floors and a reference engine.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool):
    if value:
        out.print(f"ddprobe {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Also show third-party warnings (torch, "
                                                                  "Inductor) that ddprobe keeps in its log.")] = False,
):
    from .. import foreign

    foreign.install(verbose)
    atexit.unregister(_say_kept)  # once per process, however many commands ran in it (tests run many)
    atexit.register(_say_kept)


def _say_kept() -> None:
    """The one line naming the log of the third-party messages this run kept (``ddprobe.foreign``)."""
    from .. import foreign

    line = foreign.kept()
    if line:
        sys.stderr.write(f"note: {line}\n")
