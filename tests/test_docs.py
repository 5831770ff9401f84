"""The docs hold to the code (issue 52).

- Every command the app registers has its page, ``docs/<command>.md`` (``bench``'s subcommands share
  ``docs/bench.md``), and every option its ``--help`` lists (short forms and ``--no-x`` included) appears in that
  page.
- Every ``ddprobe`` command shown in the README and in ``docs/`` runs: each fenced ``bash`` or ``console`` block is
  parsed (in ``bash`` every line, in ``console`` the lines after ``$ ``; a trailing backslash continues a line, ``&&``
  chains commands, ``#`` starts a comment, leading ``VAR=value`` words are dropped), and each line whose command is
  ``ddprobe`` or ``python -m ddprobe`` runs in a fresh process, in a temporary folder (the block's commands in order,
  in the same folder), on copies of the shipped files it names (``tests/...``, ``examples/...``), with
  ``OMP_NUM_THREADS=1``; it must exit 0.

Markers (an HTML comment on the line just before the opening fence; text after the word is free):

- ``<!-- gpu -->``: needs a GPU; ``<!-- live -->``: needs a server, or starts one; ``<!-- long -->``: runs on a CPU but
  takes minutes. These are not run: each command must parse (the command exists, every option exists, an integer or
  number option's value is one, none is given twice).
- ``<!-- exit N -->``: run, and expect exit status N (a gate that fails on purpose).

Printed output (issue 63): in a ``console`` block, the lines after a ``$ `` command up to the next one are what it
prints, and the run must print them (stdout, with stderr before or after it): compared word by word, whitespace
aside (a table's alignment and a terminal's wrapping do not count; a rule of ``─`` is as wide as its table);
``...`` stands for any text (a line of its own: any lines; inside a line: any words), ``<name>`` for one word that
varies (``<time>``). Numbers must be within ``REL_TOL`` (2%) or one unit of their last printed digit, whichever is
larger. Pages in ``DRIFTED`` are not compared yet. More words in the same comment:

- ``measured``: the output holds this machine's timings: the words are compared, not the numbers;
- ``columns N``: the block was printed on an N-column terminal (tables drop columns to fit; default 200).
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
import typer

from ddprobe.cli import app
from ddprobe.cli.app import repeated_options

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]

# Commands whose page another change writes: while a command is listed here, its page may be missing and is not held
# to the rules below (options, examples), and `ddprobe <it>` lines elsewhere are parsed only once it is registered.
# The lead empties this set once each page is in and passes.
PENDING: set[str] = set()  # commands whose page is still being written (none today)

MARKER = re.compile(r"^\s*<!--\s*(gpu|live|long|exit\s+(\d+))\b.*-->\s*$")
COMMENT = re.compile(r"^\s*<!--(.*)-->\s*$")
REL_TOL = 0.02
COLUMNS = 200
# Pages whose console blocks' printed output had drifted from the code when the comparison came in (2026-12-07), each
# owned by another change: their commands run, their output is not compared yet. The lead regenerates each page's
# blocks from a real run (`...` for what they leave out) and takes the page out of this set.
DRIFTED: set[str] = set()
FENCE = re.compile(r"^```(\w*)\s*$")
SHIPPED = ("tests/", "examples/")
ROOT_CMD = typer.main.get_command(app)


def leaf_commands(group=ROOT_CMD, path=()):
    """(path, click command) of every command a user runs: ('floor',), ('bench', 'verify'), ..."""
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if hasattr(cmd, "list_commands"):
            yield from leaf_commands(cmd, (*path, name))
        else:
            yield (*path, name), cmd


COMMANDS = dict(leaf_commands())


def page_of(path: tuple[str, ...]) -> Path:
    return DOCS / f"{path[0]}.md"


def option_names(cmd) -> list[str]:
    names = []
    for p in cmd.params:
        if getattr(p, "param_type_name", "") == "option" and not getattr(p, "hidden", False):
            names += [*p.opts, *p.secondary_opts]
    return [*names, "--help"]


def argument_names(cmd) -> list[str]:
    return [p.name.upper() for p in cmd.params if getattr(p, "param_type_name", "") == "argument"]


def test_every_command_has_a_page():
    assert len(COMMANDS) >= 10, sorted(COMMANDS)  # the walk found the app's commands
    missing = sorted(" ".join(p) for p in COMMANDS if not page_of(p).is_file() and p[0] not in PENDING)
    assert not missing, f"commands without a page in docs/: {missing}"


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=" ".join)
def test_every_option_is_in_its_page(path):
    page = page_of(path)
    if path[0] in PENDING:
        pytest.skip(f"{page.name} pending (PENDING)")
    text = page.read_text()
    cmd = COMMANDS[path]
    absent = [o for o in option_names(cmd) if not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", text)]
    absent += [a for a in argument_names(cmd) if a not in text]
    assert not absent, f"{page.relative_to(ROOT)} does not name these options of `ddprobe {' '.join(path)}`: {absent}"


# --- the examples ------------------------------------------------------------------------------------------------


def blocks(md: Path):
    """(line number, language, marker or None, lines) of each fenced bash/console block of a page."""
    lines = md.read_text().split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group(1)
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        if lang in ("bash", "console"):
            prev = next((lines[k] for k in range(start - 1, -1, -1) if lines[k].strip()), "")
            mk = MARKER.match(prev)
            yield start + 1, lang, (mk.group(1) if mk else None), lines[start + 1:j]
        i = j + 1


def block_words(md: Path) -> dict[int, str]:
    """The comment before each block's fence (line number -> its text, "" for none)."""
    lines, out, i = md.read_text().split("\n"), {}, 0
    while i < len(lines):
        if FENCE.match(lines[i]):
            prev = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
            c = COMMENT.match(prev)
            out[i + 1] = c.group(1) if c else ""
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            i = j
        i += 1
    return out


def commands_of(lang: str, body: list[str]) -> list[list[str]]:
    """The ddprobe command lines of a block, each as the arguments after ``ddprobe``."""
    logical, cur = [], None
    for line in body:
        if cur is None:
            if lang == "console":
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            cur = ""
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
            continue
        logical.append(cur + line)
        cur = None
    out = []
    for line in logical:
        for part in re.split(r"\s&&\s", line):
            words = shlex.split(part, comments=True)
            while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
                words.pop(0)
            if words[:1] == ["ddprobe"]:
                out.append(words[1:])
            elif words[:3] == ["python", "-m", "ddprobe"]:
                out.append(words[3:])
    return out


EXAMPLES = [(md, line, lang, marker, args)
            for md in PAGES if md.stem not in PENDING for line, lang, marker, body in blocks(md)
            for args in [commands_of(lang, body)] if args]


def example_id(ex) -> str:
    md, line, _, marker, _ = ex
    return f"{md.relative_to(ROOT)}:{line}" + (f"[{marker}]" if marker else "")


def resolve(args: list[str]):
    """The leaf command ``args`` name, and the arguments left for it."""
    cmd, rest = ROOT_CMD, list(args)
    path = []
    while hasattr(cmd, "list_commands"):
        assert rest and not rest[0].startswith("-"), f"no command in `ddprobe {' '.join(args)}`"
        name = rest.pop(0)
        sub = cmd.get_command(click.Context(cmd), name)
        path.append(name)
        if sub is None:
            return tuple(path), None, rest
        cmd = sub
    return tuple(path), cmd, rest


def check_parses(args: list[str]) -> None:
    """The command exists, every option exists, an integer or number option's value is one, none is given twice,
    no positional argument is left over. Callbacks (which read files) are not run."""
    path, cmd, rest = resolve(args)
    if cmd is None:
        if path[0] in PENDING:
            return
        pytest.fail(f"`ddprobe {' '.join(args)}`: no command {' '.join(path)!r}")
    by_name = {o: p for p in cmd.params if getattr(p, "param_type_name", "") == "option"
               for o in (*p.opts, *p.secondary_opts)}
    arguments = [p for p in cmd.params if getattr(p, "param_type_name", "") == "argument"]
    positional, i = [], 0
    while i < len(rest):
        word = rest[i]
        if word.startswith("-") and word != "-":
            name, eq, value = word.partition("=")
            if name == "--help":
                i += 1
                continue
            p = by_name.get(name)
            assert p is not None, f"`ddprobe {' '.join(args)}`: `ddprobe {' '.join(path)}` has no option {name}"
            if p.is_flag or name in p.secondary_opts:
                assert not eq, f"{name} takes no value"
            else:
                if not eq:
                    i += 1
                    assert i < len(rest), f"{name} needs a value"
                    value = rest[i]
                kind = getattr(getattr(p, "type_descriptor", None), "annotation", None)
                if kind in (int, float):
                    try:
                        kind(value)
                    except ValueError:
                        pytest.fail(f"`ddprobe {' '.join(args)}`: {name} takes {kind.__name__}, not {value!r}")
        else:
            positional.append(word)
        i += 1
    room = sum(10**6 if a.nargs == -1 else a.nargs for a in arguments)
    assert len(positional) <= room, f"`ddprobe {' '.join(args)}`: arguments left over: {positional}"
    twice = repeated_options(cmd, rest)
    assert not twice, f"`ddprobe {' '.join(args)}`: given twice: {twice}"


def ddprobe_exe() -> list[str]:
    script = Path(sys.executable).with_name("ddprobe")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "ddprobe"]


def stage_shipped(args: list[str], cwd: Path) -> None:
    """Copy the shipped files a command names into its folder, at the same relative path."""
    for word in args:
        value = word.partition("=")[2] if word.startswith("-") else word
        for v in value.split(","):
            if v.startswith(SHIPPED) and (ROOT / v).exists():
                src, dst = ROOT / v, cwd / v
                if dst.exists():
                    continue
                dst.parent.mkdir(parents=True, exist_ok=True)
                (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst)


def test_the_examples_were_found():
    """The parser finds the examples (a README without runnable ones, or a parser that finds none, fails here)."""
    readme = [ex for ex in EXAMPLES if ex[0].name == "README.md"]
    assert len(readme) >= 8 and any(ex[3] is None for ex in readme)
    assert {ex[4][0][0] for ex in EXAMPLES} >= {"commit", "floor", "advise", "diagnose", "gpu-util", "report", "gate"}


@pytest.mark.parametrize("ex", EXAMPLES, ids=example_id)
def test_example(ex, tmp_path):
    md, line, lang, marker, commands = ex
    for args in commands:
        check_parses(args)
    if marker in ("gpu", "live", "long"):
        return
    expect = int(marker.split()[1]) if marker and marker.startswith("exit") else 0
    words = block_words(md).get(line, "")
    cols = re.search(r"\bcolumns\s+(\d+)", words)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": cols.group(1) if cols else str(COLUMNS),
           "XDG_CACHE_HOME": str(tmp_path / ".cache")}
    env.pop("TRITON_INTERPRET", None)
    printed = printed_outputs(md, line) if lang == "console" else [None] * len(commands)
    for args, want in zip(commands, printed):
        stage_shipped(args, tmp_path)
        r = subprocess.run([*ddprobe_exe(), *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=300, stdin=subprocess.DEVNULL)
        assert r.returncode == expect, (f"{example_id(ex)}: `ddprobe {shlex.join(args)}` exited {r.returncode}, "
                                        f"not {expect}:\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}")
        if want is not None and str(md.relative_to(ROOT)) not in DRIFTED:
            why = differs(want, [r.stdout, r.stderr + "\n" + r.stdout, r.stdout + "\n" + r.stderr],
                          numbers=not re.search(r"\bmeasured\b", words))
            assert not why, (f"{example_id(ex)}: `ddprobe {shlex.join(args)}` no longer prints what the page shows: "
                             f"{why}\n--- printed:\n{r.stdout}\n{r.stderr}")


# --- printed output against the page ----------------------------------------------------------------------------

NUMBER = r"\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?"


def printed_outputs(md: Path, line: int) -> list[str]:
    """The output lines under each ``$ ddprobe ...`` command of the console block at ``line`` (one text per ddprobe
    command, in order; a command's continuation lines are not output)."""
    body = next(b for ln, lang, _, b in blocks(md) if ln == line)
    outs, cur, cont = [], None, False
    for text in body:
        if text.startswith("$ "):
            if cur is not None:
                outs.append(cur)
            cur = [] if commands_of("console", [text.rstrip("\\")]) else None
            cont = text.rstrip().endswith("\\")
        elif cont:
            cont = text.rstrip().endswith("\\")
        elif cur is not None:
            cur.append(text)
    if cur is not None:
        outs.append(cur)
    return ["\n".join(o) for o in outs]


def pattern(want: str) -> tuple[re.Pattern, list[str]]:
    """A regex for the printed text ``want`` (whitespace-insensitive, ``...`` any text, ``<name>`` one word, each
    number a group) and its numbers as printed."""
    parts, nums = [], []
    for i, tok in enumerate(want.split()):
        if tok == "...":
            parts.append("(?:\\s.*?)?" if i else ".*?")
            continue
        if set(tok) == {"─"}:  # a table's rule: as wide as the table
            tok = "─"
        piece = ""
        for m in re.finditer(rf"(\.\.\.)|(<[a-z][a-z-]*>)|({NUMBER})|(.)", tok, flags=re.S):
            if m.group(1):
                piece += ".*?"
            elif m.group(2):
                piece += r"\S+?"
            elif m.group(3):
                piece += f"({NUMBER})"
                nums.append(m.group(3))
            else:
                piece += "─+" if m.group(4) == "─" else re.escape(m.group(4))
        parts.append(("\\s+" if i and not parts[-1].startswith("(?:") else "\\s*" if i else "") + piece)
    return re.compile("\\s*" + "".join(parts) + "\\s*", flags=re.S), nums


def close(want: str, got: str) -> bool:
    """``got`` is ``want`` within REL_TOL or one unit of ``want``'s last printed digit."""
    w, g = float(want.replace(",", "")), float(got.replace(",", ""))
    unit = 10.0 ** -len(want.split(".")[1]) if "." in want and "e" not in want else 1.0
    return abs(g - w) <= max(REL_TOL * abs(w), unit) + 1e-12


def differs(want: str, printed: list[str], numbers: bool = True) -> str:
    """Why none of ``printed`` is the page's ``want`` ("" when one is)."""
    rx, nums = pattern(want)
    why = "its words differ (a line changed, or one is missing)"
    for text in printed:
        m = rx.fullmatch(text)
        if m is None:
            continue
        if not numbers:
            return ""
        off = [f"{w} -> {g}" for w, g in zip(nums, m.groups()) if not close(w, g)]
        if not off:
            return ""
        why = f"numbers moved beyond {REL_TOL:.0%} (or one unit of the last digit): {', '.join(off[:8])}"
    return why


def test_the_comparison_itself():
    """Alignment and wrapping do not count, ``...`` elides, a number may move within the tolerance, not beyond."""
    want = "  ctx   floor   gap\n 32k   12.9 ms   12.3x\n...\nreport: ddprobe-<time>/r.html"
    assert not differs(want, ["ctx floor gap\n32k 12.95 ms\n  12.3x\nmore\nlines\nreport: ddprobe-0612/r.html"])
    assert "12.9 -> 13.9" in differs(want, ["ctx floor gap 32k 13.9 ms 12.3x report: ddprobe-1/r.html"])
    assert not differs(want, ["ctx floor gap 32k 13.9 ms 12.3x report: ddprobe-1/r.html"], numbers=False)
    assert "words differ" in differs(want, ["ctx floor gap 32k 12.9 ms 12.3x bound report: ddprobe-1/x.html"])
    assert not differs("a (...) b ...", ["a (x y z) b"]) and not differs("1,536 B", ["1,540 B"])
    assert differs("0.46", ["0.48"])  # 4%: beyond both 2% and one unit of the second decimal


# --- the links ---------------------------------------------------------------------------------------------------


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(md: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", md.read_text(), flags=re.S | re.M)
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, flags=re.M)}


@pytest.mark.parametrize("md", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(md):
    """Every relative link of a page names a file that is there, and a heading of it when it names one."""
    text = re.sub(r"^```.*?^```", "", md.read_text(), flags=re.S | re.M)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (md.parent / path).resolve() if path else md
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(target)
    assert not broken, f"{md.relative_to(ROOT)}: links that lead nowhere: {broken}"


def test_every_cpu_console_block_is_compared():
    """Every console block the suite runs shows what its commands print (a block of commands alone compares
    nothing), and every such block outside ``DRIFTED`` is compared by ``test_example``."""
    run = [ex for ex in EXAMPLES if ex[2] == "console" and ex[3] not in ("gpu", "live", "long")]
    assert len([ex for ex in run if ex[0].name == "README.md"]) >= 7
    empty = [example_id(ex) for ex in run if not all(o.strip() for o in printed_outputs(ex[0], ex[1]))]
    assert not empty, f"console blocks that show no output to compare: {empty}"
    assert all((ROOT / p).is_file() for p in DRIFTED)
