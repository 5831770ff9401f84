"""The house drawn from the code's own imports (an AST scan, nothing imported): training code is reached from no
module of the product, transitively."""
import ast
from pathlib import Path

import ddprobe

ROOT = Path(ddprobe.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every ddprobe module a file imports (relative imports resolved; ``from X import y`` also names X.y, which
    is a module when y is one), at any depth of the file (lazy imports inside functions count)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in found if m == "ddprobe" or m.startswith("ddprobe.")}


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in ROOT.rglob("*.py")}
    return {m: {i for i in imports_of(p) if i in files} for m, p in files.items()}


def reached(g: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(g[m])
    return seen


def test_the_scan_finds_the_imports_it_must():
    """The scan is not blind: training reaches the engine, and a relative import resolves to its module."""
    g = graph()
    assert "ddprobe.engine.generate" in reached(g, "ddprobe.training.recall_curriculum")
    assert "ddprobe.training.train" in g["ddprobe.training.curriculum"]
    assert "ddprobe.engine.kernels" in reached(g, "ddprobe.engine.generate")


def test_no_product_module_reaches_training():
    g = graph()
    product = [m for m in g if not m.startswith("ddprobe.training")]
    assert "ddprobe.engine" in product and "ddprobe.cli" in product
    leaks = {m: sorted(x for x in reached(g, m) if x.startswith("ddprobe.training")) for m in product}
    assert not {m: v for m, v in leaks.items() if v}


def in_cli(m: str) -> bool:
    return m == "ddprobe.cli" or m.startswith("ddprobe.cli.")


def test_nothing_below_the_commands_reaches_them():
    """cli -> probes, reports, server -> engine -> kernels: no module but the entry point (``python -m ddprobe``)
    reaches ddprobe.cli, transitively: a pipeline moved out of a command never calls back up into it."""
    g = graph()
    assert "ddprobe.cli.floor" in reached(g, "ddprobe.__main__")  # the one arrow allowed is seen
    below = [m for m in g if not (in_cli(m) or m == "ddprobe.__main__")]
    assert "ddprobe.probes.gpu_util" in below and "ddprobe.probes.floor" in below
    leaks = {m: sorted(x for x in reached(g, m) if in_cli(x)) for m in below}
    assert not {m: v for m, v in leaks.items() if v}
