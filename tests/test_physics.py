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
