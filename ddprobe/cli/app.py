"""The Typer app and its root options; the commands register themselves on it."""
from __future__ import annotations

from typing import Annotated

import typer

from .. import __version__
from .options import out

app = typer.Typer(
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
):
    pass
