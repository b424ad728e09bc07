"""The package layout's rules (docs/architecture.md), checked on the source.

* imports flow one way: a package imports only packages of a lower layer (or itself);
* nothing outside ``asymo.lab`` imports it (but the command line, lazily, for the commands that
  are the lab's front end);
* no private name (``_x``) is imported from another package;
* no import cycle between modules;
* ``import asymo`` plus a matmul and a conv2d loads no ``asymo.lab`` module.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "asymo"

#: layer of each top-level subpackage: a package may import packages of a lower layer only
LAYERS = {
    "hw": 0, "profile": 1, "runtime": 2, "plan": 3, "ops": 4,
    "models": 5, "dvfs": 5, "calibrate": 6, "pipeline": 6, "lab": 7, "cli": 8,
}
#: ``asymo`` itself (the lazy public API) and the compiled modules sit outside the layers
UNLAYERED = {"", "_native", "_matmul_fast", "__main__"}
#: names starting with "_" that are not private: the compiled modules and the version
COMPILED = {"_native", "_matmul_fast", "__version__"}
#: the command line may import the lab (its ``emulate`` and ``bench`` commands are its front end)
LAB_IMPORTERS = {"cli", "lab"}


def _module_name(path):
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _package(module):
    """``asymo.plan.gemm`` -> ``plan``; ``asymo`` -> ``''``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _imports(path, module):
    """(imported module, imported names, line, top_level) of every asymo import in the file."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    top_level = set(id(n) for n in tree.body)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "asymo" or a.name.startswith("asymo."):
                    out.append((a.name, [], node.lineno, id(node) in top_level))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[:len(base) - node.level + (1 if is_pkg else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "asymo" or target.startswith("asymo."):
                out.append((target, [a.name for a in node.names], node.lineno,
                            id(node) in top_level))
    return out


def _sources():
    return sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def _graph():
    modules = {_module_name(p): p for p in _sources()}
    edges = {}
    for mod, path in modules.items():
        for target, names, line, top in _imports(path, mod):
            resolved = []
            for n in names:  # "from asymo.plan import gemm" imports a module
                if f"{target}.{n}" in modules:
                    resolved.append((f"{target}.{n}", []))
                else:
                    resolved.append((target, [n]))
            if not names:
                resolved.append((target, []))
            for t, ns in resolved:
                edges.setdefault(mod, []).append((t, ns, line, top))
    return modules, edges


def test_imports_flow_down_the_layers():
    modules, edges = _graph()
    bad = []
    for mod, targets in edges.items():
        src = _package(mod)
        for t, _, line, _ in targets:
            dst = _package(t)
            if src == dst or dst in UNLAYERED or src in UNLAYERED:
                continue
            if dst == "lab":
                if src not in LAB_IMPORTERS:
                    bad.append(f"{mod}:{line} imports {t} (nothing outside asymo.lab may)")
                continue
            if LAYERS[dst] >= LAYERS[src]:
                bad.append(f"{mod}:{line} imports {t} (layer {dst} is not below {src})")
    assert not bad, "\n".join(bad)


def test_every_subpackage_has_a_layer():
    for p in sorted(PKG.iterdir()):
        if p.is_dir() and (p / "__init__.py").exists():
            assert p.name in LAYERS, f"asymo/{p.name} has no layer in tests/test_layout.py"


def test_no_private_name_crosses_a_package():
    modules, edges = _graph()
    bad = []
    for mod, targets in edges.items():
        for t, names, line, _ in targets:
            if _package(t) == _package(mod):
                continue
            leaf = t.rsplit(".", 1)[-1]
            private = [n for n in names if n.startswith("_") and n not in COMPILED]
            if leaf.startswith("_") and leaf not in COMPILED:
                private.append(leaf)
            if private:
                bad.append(f"{mod}:{line} imports {', '.join(private)} from {t}")
    assert not bad, "\n".join(bad)


def test_no_import_cycle():
    modules, edges = _graph()
    graph = {m: sorted({t for t, _, _, _ in edges.get(m, ()) if t in modules and t != m})
             for m in modules}
    # a package's __init__ importing its own submodules is how packages re-export, not a cycle
    for m in graph:
        graph[m] = [t for t in graph[m] if not t.startswith(m + ".")]
    state, stack, cycles = {}, [], []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in graph[m]:
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_the_runtime_never_loads_the_lab():
    code = (
        "import sys, numpy as np, asymo\n"
        "a = np.ones((64, 64), np.float32)\n"
        "asymo.matmul(a, a)\n"
        "asymo.conv2d(np.ones((1, 3, 8, 8), np.float32), np.ones((4, 3, 3, 3), np.float32))\n"
        "print(' '.join(m for m in sys.modules if m.startswith('asymo.lab')))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("ASYMO_TOPOLOGY", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "", f"lab modules loaded by the runtime: {out.stdout}"


def test_public_api_is_small_and_importable():
    import asymo

    assert len(asymo.__all__) <= 20
    for name in asymo.__all__:
        assert getattr(asymo, name) is not None
    assert "importlib" not in dir(asymo) and "annotations" not in dir(asymo)
    with pytest.raises(AttributeError):
        asymo.no_such_name
