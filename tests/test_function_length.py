"""Short functions, read from the code itself (an AST scan): every function of the package under 80 lines, and every
command's body (the statements after its signature and docstring) under 40: a command parses, calls one library
function and prints (the architecture in docs/develop.md: no logic in ddprobe/cli)."""
import ast
from pathlib import Path

import ddprobe

ROOT = Path(ddprobe.__file__).parent
MAX_FUNCTION = 80  # lines, `def` to the last line, signature and docstring included
MAX_COMMAND_BODY = 40  # lines of a command's statements (signature and docstring left out)
REGISTERS = ("command", "callback")  # app.command(), bench_app.command("verify"), app.callback()


def functions(source: str):
    """Every function and method of ``source`` (nested ones included)."""
    return [n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def length(fn) -> int:
    return fn.end_lineno - fn.lineno + 1


def body_length(fn) -> int:
    """Lines from the first statement after the docstring to the last."""
    body = fn.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value,
                                                                                                 str):
        body = body[1:]
    return body[-1].end_lineno - body[0].lineno + 1 if body else 0


def is_command(fn) -> bool:
    """Registered with Typer by a decorator: ``@<app>.command(...)`` or ``@<app>.callback(...)``."""
    return any(isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr in REGISTERS
               for d in fn.decorator_list)


def commands() -> dict[str, tuple[str, int]]:
    """{function name: (file, body lines)} of every command in ddprobe/cli."""
    found = {}
    for p in sorted((ROOT / "cli").glob("*.py")):
        for fn in functions(p.read_text()):
            if is_command(fn):
                found[fn.name] = (p.name, body_length(fn))
    return found


def test_the_scan_measures_what_it_must():
    """Not blind: a function of 80 lines is measured as 80, a docstring is not body, a decorated command is found
    and a plain function is not."""
    src = "def f(a,\n      b):\n    '''doc'''\n" + "    x = 1\n" * 77 + "\n\n@app.command('x')\ndef g():\n    pass\n"
    f, g = functions(src)
    assert (length(f), body_length(f), is_command(f)) == (80, 77, False)
    assert (length(g), body_length(g), is_command(g)) == (2, 1, True)


def test_the_scan_finds_every_registered_command():
    """The AST scan finds exactly the functions Typer runs (the app's commands, its callback, bench's commands)."""
    import typer.main

    from ddprobe.cli import app

    def names(t: typer.Typer) -> set[str]:
        own = {c.callback.__name__ for c in t.registered_commands}
        own |= {t.registered_callback.callback.__name__} if t.registered_callback else set()
        return own.union(*(names(g.typer_instance) for g in t.registered_groups))

    assert typer.main.get_command(app).commands  # the app builds
    assert names(app) == set(commands()) and {"floor", "advise", "diagnose", "gpu_util", "verify"} <= names(app)


def test_every_command_body_is_under_40_lines():
    long = {name: where for name, where in commands().items() if where[1] >= MAX_COMMAND_BODY}
    assert not long, f"command bodies of {MAX_COMMAND_BODY} lines or more (move the pipeline into probes/): {long}"


def test_every_function_is_under_80_lines():
    long = sorted((length(fn), str(p.relative_to(ROOT)), fn.name) for p in ROOT.rglob("*.py")
                  for fn in functions(p.read_text()) if length(fn) >= MAX_FUNCTION)
    assert not long, f"functions of {MAX_FUNCTION} lines or more: {long}"
