"""The physics package's own rules: standard library only (and ddprobe's error type), and one constructor of the
step model (``physics.plan.plan``) that every command reaches."""
import ast
import sys
from pathlib import Path

import ddprobe

PKG = Path(ddprobe.__file__).parent


def _calls(tree: ast.AST, name: str):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if (isinstance(f, ast.Name) and f.id == name) or (isinstance(f, ast.Attribute) and f.attr == name):
                yield node.lineno


def test_one_step_model_constructor():
    found = {}
    for path in PKG.rglob("*.py"):
        lines = list(_calls(ast.parse(path.read_text()), "StepModel"))
        if lines:
            found[str(path.relative_to(PKG))] = lines
    assert list(found) == ["physics/plan.py"], found


def test_physics_imports_only_the_standard_library():
    stdlib = set(sys.stdlib_module_names)
    for path in (PKG / "physics").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                mods = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level == 1:
                    continue  # within physics
                if node.level == 2:
                    assert node.module in ("units", "jsonfile"), f"{path.name} imports ddprobe.{node.module}"
                    continue
                mods = [(node.module or "").split(".")[0]]
            else:
                continue
            for m in mods:
                assert m in stdlib or m == "__future__", f"{path.name} imports {m}"


def test_engine_preset_and_served_model_are_one_registry():
    from ddprobe.physics.models import get_model
    from ddprobe.physics.plan import StepInput, plan
    from ddprobe.units import DDProbeError
    import pytest

    k2 = get_model("k2")
    served = get_model("kimi-k2.6")
    assert k2.kind == "engine" and served.kind == "served"
    # the engine preset is one GPU's share of K2 at tp 8: 8 of its 64 heads, hidden shrunk to 1024, 48 local experts
    assert (k2.num_heads, k2.hidden_size, k2.n_routed_experts) == (8, 1024, 48)
    assert (served.num_heads, served.hidden_size, served.n_routed_experts) == (64, 7168, 384)
    with pytest.raises(DDProbeError, match="engine preset, already one GPU's share"):
        plan(StepInput(k2, tp=8))
    with pytest.raises(DDProbeError, match="--heads sets an engine preset's heads"):
        get_model("kimi-k2.6", heads=8)


def test_reports_import_no_circle():
    """The reports' modules import one another without a circle (issue 63: findings -> trace -> sections ->
    findings): the graph of their relative imports, at any depth of the module, has no cycle."""
    import ast as _ast

    mods = {p.stem: p for p in (PKG / "reports").glob("*.py")}
    edges = {m: {(n.module or "").split(".")[0] for n in _ast.walk(_ast.parse(p.read_text()))
                 if isinstance(n, _ast.ImportFrom) and n.level == 1} |
             {a.name for n in _ast.walk(_ast.parse(p.read_text()))
              if isinstance(n, _ast.ImportFrom) and n.level == 1 and not n.module for a in n.names}
             for m, p in mods.items()}

    def reach(start):
        seen, todo = set(), [start]
        while todo:
            for nxt in edges.get(todo.pop(), ()):
                if nxt in mods and nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    circles = sorted(m for m in mods if m in reach(m))
    assert not circles, f"reports modules in an import circle: {circles}"
