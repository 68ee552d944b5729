"""The house's import rules (README "Architecture", shared design): no import circles, arrows only
downward through ``LAYERS``, nothing in the package imports ``neo_train.testing``, and topology
and planning never import torch.distributed.

Every module under ``neo_train/`` is parsed with ``ast``: module-level and function-level imports
alike (a lazy import is an arrow too), relative imports resolved. An arrow goes to the module named: ``from a.b import c`` is an arrow to
``a.b.c`` when that is a module, else to ``a.b``; the parent packages Python also runs are not
arrows. Imports under ``if TYPE_CHECKING:`` never run and are not arrows; neither are dynamic
imports (``importlib``).

``KNOWN_VIOLATIONS`` lists what issue 15 has yet to remove, each with what is pending. It must
match the violations found exactly: a new one fails, and so does an entry whose violation is
gone (remove it), so the list only shrinks.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {"neo_train": REPO / "neo_train"}

# The layers, top to bottom. A module may import its own group and any group of a lower layer;
# the groups of one layer are independent of each other. A name covers the module and everything
# under it, the most specific name winning (neo_train.planning.planner is planning, not sharding);
# the root package's name covers only neo_train/__init__.py (``__version__``).
LAYERS: tuple[tuple[str, Mapping[str, tuple[str, ...]]], ...] = (
    ("entry points", {
        "cli": ("neo_train.cli", "neo_train.__main__", "neo_train.planning.plan_cli"),  # plan_cli: `neo-train plan`
        "testing": ("neo_train.testing",),  # tests' and benchmarks' helpers; the package never imports it
    }),
    ("train", {"train": ("neo_train.train",)}),
    ("parallel", {"parallel": ("neo_train.parallel",)}),
    ("sharding", {"sharding": ("neo_train.sharding",)}),  # runtime: the collection, one file per type, hot rows
    ("comm | modules | simulator", {
        "comm": ("neo_train.comm",),
        "modules": ("neo_train.modules",),  # plain DLRM pieces; storage.py builds the kernels
        "simulator": ("neo_train.topology",),  # networks, schedules, workloads, traces: plans, never runs them
    }),
    ("planning | kernels", {"planning": ("neo_train.planning",), "kernels": ("neo_train.kernels",)}),
    ("data | plan | cluster", {
        "data": ("neo_train.data",),
        "plan": ("neo_train.planning.plan",),  # the plan's types + JSON, what the runtime reads
        "cluster": ("neo_train.topology.spec",),  # ClusterSpec: what the planner and the simulator price on
    }),
    ("config", {"config": ("neo_train.config",)}),
    ("schedules", {"schedules": ("neo_train.comm.schedules",)}),  # algorithms as data, stdlib only
    ("root", {"root": ("neo_train",)}),
)
NO_TORCH_DISTRIBUTED = ("simulator", "cluster", "planning", "plan")  # groups that must run without torch.distributed
TESTING = "neo_train.testing"

KNOWN_VIOLATIONS: dict[str, str] = {}


# ---- the checker ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Import:
    src: str
    """The importing module."""
    dst: str
    """The imported module (of the package) or dotted name (outside it)."""
    line: int


@dataclass
class Graph:
    files: dict[str, str] = field(default_factory=dict)
    """Module -> its file (posix, relative to the folder ``build_graph`` was given)."""
    imports: list[Import] = field(default_factory=list)
    """Arrows between modules of the package."""
    external: list[Import] = field(default_factory=list)
    """Imports of anything else (torch, ...), by the dotted name imported."""


def _modules(packages: Mapping[str, Path]) -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package's __init__) for every .py file under the packages."""
    out = {}
    for pkg, folder in packages.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            name = ".".join([pkg, *(parts[:-1] if is_pkg else parts)])
            out[name] = (path, is_pkg)
    return out


class _Imports(ast.NodeVisitor):
    """Every import statement's (dotted name, imported names, level, line), skipping the bodies of
    ``if TYPE_CHECKING:``."""

    def __init__(self) -> None:
        self.found: list[tuple[str, tuple[str, ...], int, int]] = []

    def visit_If(self, node: ast.If) -> None:
        t = node.test
        if (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
                isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"):
            for n in node.orelse:
                self.visit(n)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self.found.append((a.name, (), 0, node.lineno))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        self.found.append((node.module or "", tuple(a.name for a in node.names), node.level, node.lineno))


def build_graph(packages: Mapping[str, Path], base: Path) -> Graph:
    """Parse every module of ``packages`` (name -> folder); file names relative to ``base``."""
    mods = _modules(packages)
    g = Graph(files={m: p.relative_to(base).as_posix() for m, (p, _) in mods.items()})

    def owner(name: str) -> str:  # the module an import of ``name`` runs last (an attribute's module)
        while name not in mods and "." in name:
            name = name.rpartition(".")[0]
        return name

    for mod, (path, is_pkg) in mods.items():
        v = _Imports()
        v.visit(ast.parse(path.read_text(), str(path)))
        here = (mod if is_pkg else mod.rpartition(".")[0]).split(".")
        for name, names, level, line in v.found:
            if level:
                name = ".".join(here[: len(here) - (level - 1)] + ([name] if name else []))
            # ``from a import b``: b is a module of a, or a name a defines
            for target in dict.fromkeys([f"{name}.{n}" for n in names] if names else [name]):
                if any(target == p or target.startswith(p + ".") for p in packages):
                    if owner(target) != mod:
                        g.imports.append(Import(mod, owner(target), line))
                else:
                    g.external.append(Import(mod, target, line))
    return g


def group_of(module: str, layers=LAYERS) -> tuple[int, str] | None:
    """(layer index, group) of ``module``: the most specific name covering it; None if none. A
    top-level package's name (no dot: the root) covers its ``__init__`` only."""
    best: tuple[int, int, str] | None = None
    for i, (_, groups) in enumerate(layers):
        for group, names in groups.items():
            for n in names:
                if module == n or ("." in n and module.startswith(n + ".")):
                    if best is None or len(n) > best[0]:
                        best = (len(n), i, group)
    return None if best is None else (best[1], best[2])


def circles(g: Graph) -> dict[str, str]:
    """Strongly connected components of more than one module (Tarjan): key 'circle: files', value
    one cycle through them with the lines of its imports."""
    succ: dict[str, dict[str, int]] = {m: {} for m in g.files}
    for imp in g.imports:
        succ[imp.src].setdefault(imp.dst, imp.line)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[list[str]] = []

    def visit(v: str) -> None:  # iterative: deep chains must not hit the recursion limit
        work = [(v, iter(sorted(succ[v])))]
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        while work:
            u, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(succ[w]))))
                elif w in on:
                    low[u] = min(low[u], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[u])
            if low[u] == index[u]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == u:
                        break
                if len(comp) > 1:
                    comps.append(sorted(comp))

    for m in sorted(g.files):
        if m not in index:
            visit(m)
    out = {}
    for comp in comps:  # the shortest cycle through the component's first module (breadth first)
        inside, start = set(comp), comp[0]
        parent: dict[str, str] = {}
        frontier = [start]
        while start not in parent:
            nxt = []
            for u in frontier:
                for w in sorted(succ[u]):
                    if w in inside and w not in parent:
                        parent[w] = u
                        nxt.append(w)
            frontier = nxt
        path = [start]
        while len(path) == 1 or path[-1] != start:
            path.append(parent[path[-1]])
        path.reverse()
        steps = " -> ".join(f"{g.files[a]} (line {succ[a][b]})" for a, b in zip(path, path[1:]))
        out["circle: " + ", ".join(g.files[m] for m in comp)] = f"{steps} -> {g.files[start]}"
    return out


def arrows_against_layers(g: Graph, layers=LAYERS) -> dict[str, str]:
    """Imports from a group to a higher layer's, or to another group of its own layer: key
    'src file -> dst file', value the groups and lines."""
    found = []
    for imp in g.imports:
        a, b = group_of(imp.src, layers), group_of(imp.dst, layers)
        if a is None or b is None or a[1] == b[1] or b[0] > a[0]:
            continue
        how = "up" if b[0] < a[0] else "sideways"
        found.append((f"{g.files[imp.src]} -> {g.files[imp.dst]}", f"{a[1]} imports {how} into {b[1]}", imp.line))
    return _by_key(found)


def unplaced(g: Graph, layers=LAYERS) -> list[str]:
    return sorted(g.files[m] for m in g.files if group_of(m, layers) is None)


def _by_key(found: list[tuple[str, str, int]]) -> dict[str, str]:
    """(key, what, line) -> {key: '[what: ]line a, b'}, lines deduplicated."""
    out: dict[str, tuple[str, set[int]]] = {}
    for key, what, line in found:
        out.setdefault(key, (what, set()))[1].add(line)
    lines_of = {k: "line " + ", ".join(map(str, sorted(lines))) for k, (_, lines) in out.items()}
    return {k: f"{what}: {lines_of[k]}" if what else lines_of[k] for k, (what, _) in out.items()}


def imports_of_testing(g: Graph, testing: str = TESTING) -> dict[str, str]:
    return _by_key([(f"{g.files[i.src]} imports {testing}", "", i.line) for i in g.imports if i.dst == testing])


def torch_distributed_imports(g: Graph, layers=LAYERS, groups=NO_TORCH_DISTRIBUTED) -> dict[str, str]:
    return _by_key([
        (f"{g.files[i.src]} imports torch.distributed", "", i.line) for i in g.external
        if (i.dst == "torch.distributed" or i.dst.startswith("torch.distributed."))
        and (group_of(i.src, layers) or (0, ""))[1] in groups
    ])


# ---- the package ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def graph() -> Graph:
    return build_graph(PACKAGES, REPO)


def _compare(found: dict[str, str], kind: str) -> None:
    known = {k for k in KNOWN_VIOLATIONS if _kind(k) == kind}
    new = sorted(set(found) - known)
    gone = sorted(known - set(found))
    msg = [f"new {kind} violation: {k} ({found[k]})" for k in new]
    msg += [f"KNOWN_VIOLATIONS lists '{k}', which is no longer a violation: remove the entry" for k in gone]
    assert not msg, "\n".join(msg)


def _kind(key: str) -> str:
    if key.startswith("circle: "):
        return "circle"
    if key.endswith(f" imports {TESTING}"):
        return "testing"
    if key.endswith(" imports torch.distributed"):
        return "torch.distributed"
    return "arrow"


def test_every_module_has_a_layer(graph):
    assert len(graph.files) > 50
    assert not unplaced(graph), f"modules in no layer of LAYERS (add them): {unplaced(graph)}"


def test_no_import_circles(graph):
    _compare(circles(graph), "circle")


def test_arrows_point_down(graph):
    _compare(arrows_against_layers(graph), "arrow")


def test_the_package_never_imports_testing(graph):
    _compare(imports_of_testing(graph), "testing")


def test_topology_and_planning_import_no_torch_distributed(graph):
    _compare(torch_distributed_imports(graph), "torch.distributed")


def test_known_violations_say_what_is_pending():
    for key, why in KNOWN_VIOLATIONS.items():
        assert why.startswith("issue 15, pending: ") and len(why) > len("issue 15, pending: "), key


def test_every_group_name_is_a_module(graph):
    """A name in LAYERS that matches no module is a typo or a module since moved."""
    names = [n for _, groups in LAYERS for ns in groups.values() for n in ns]
    missing = [n for n in names if not any(m == n or m.startswith(n + ".") for m in graph.files)]
    assert not missing, f"LAYERS names modules that do not exist: {missing}"


# The arrows issue 15 found in the old main, as module pairs: each must be against LAYERS (a test
# that cannot fail on them would guard nothing). Circles are the generic check's (tested below).
ISSUE_15_ARROWS = [
    ("neo_train.parallel.model_parallel", "neo_train.train.trainer"),  # parallel -> train
    ("neo_train.train.checkpoint.save_load", "neo_train.train.trainer"),  # allowed (same group): control
    ("neo_train.config", "neo_train.comm.executor"),  # config -> comm
    ("neo_train.topology.workload", "neo_train.sharding.collection"),  # simulator -> runtime sharding
    ("neo_train.topology.spec", "neo_train.planning.cost_model"),  # the cluster description -> planning
    ("neo_train.planning.cost_model", "neo_train.sharding.collection"),  # planning -> runtime sharding
    ("neo_train.planning.planner", "neo_train.planning.plan_cli"),  # planner -> CLI formatting
    ("neo_train.planning.plan", "neo_train.planning.cost_model"),  # the plan's types -> the cost model
    ("neo_train.modules.dlrm", "neo_train.sharding.collection"),  # the model -> distribution
    ("neo_train.modules.dlrm", "neo_train.comm.awaitable"),  # the model -> comm (sideways)
    ("neo_train.kernels.base", "neo_train.train.trainer"),  # the optimizer spec from the trainer
    ("neo_train.topology.spec", "neo_train.testing"),
    ("neo_train.comm.replay", "neo_train.testing"),
]


@pytest.mark.parametrize("src, dst", ISSUE_15_ARROWS)
def test_the_issue_arrows_are_against_the_layers(src, dst):
    g = Graph(files={src: src.replace(".", "/") + ".py", dst: dst.replace(".", "/") + ".py"},
              imports=[Import(src, dst, 1)])
    found = arrows_against_layers(g)
    if src.startswith("neo_train.train.") and dst.startswith("neo_train.train."):
        assert found == {}
    else:
        assert list(found) == [f"{g.files[src]} -> {g.files[dst]}"], found


# ---- the checker itself, on a package written here ------------------------------------------------
TOY_LAYERS = (
    ("top", {"top": ("toy.top",)}),
    ("mid", {"left": ("toy.left",), "right": ("toy.right",)}),
    ("low", {"low": ("toy.low",)}),
    ("root", {"root": ("toy",)}),
)


def _toy(tmp_path: Path, files: dict[str, str]) -> Graph:
    for rel, text in {"toy/__init__.py": "", **files}.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return build_graph({"toy": tmp_path / "toy"}, tmp_path)


def test_checker_reports_a_circle_with_both_files(tmp_path):
    g = _toy(tmp_path, {
        "toy/low/__init__.py": "",
        "toy/low/a.py": "from . import b\n",
        "toy/low/b.py": "def f():\n    from .a import x  # lazy: an arrow all the same\n",
        "toy/low/c.py": "import toy.low.a\n",
    })
    assert circles(g) == {
        "circle: toy/low/a.py, toy/low/b.py": "toy/low/a.py (line 1) -> toy/low/b.py (line 2) -> toy/low/a.py",
    }


def test_checker_reports_upward_and_sideways_arrows_with_both_files(tmp_path):
    g = _toy(tmp_path, {
        "toy/top.py": "from .left import f\nfrom . import low\n",  # downward: allowed
        "toy/left.py": "def g():\n    from toy.top import h\n",
        "toy/right.py": "from .left import f\n",
        "toy/low.py": "import toy\n",
    })
    assert arrows_against_layers(g, TOY_LAYERS) == {
        "toy/left.py -> toy/top.py": "left imports up into top: line 2",
        "toy/right.py -> toy/left.py": "right imports sideways into left: line 1",
    }
    assert circles(g) == {
        "circle: toy/left.py, toy/top.py": "toy/left.py (line 2) -> toy/top.py (line 1) -> toy/left.py",
    }


def test_checker_skips_type_checking_and_finds_testing_and_torch_distributed(tmp_path):
    g = _toy(tmp_path, {
        "toy/testing.py": "",
        "toy/top.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .left import T\n",
        "toy/left.py": "from .top import x\nfrom . import testing\n",
        "toy/low.py": "def f():\n    import torch.distributed as dist\n\nfrom torch import distributed\n",
    })
    assert circles(g) == {}
    assert arrows_against_layers(g, TOY_LAYERS) == {"toy/left.py -> toy/top.py": "left imports up into top: line 1"}
    assert imports_of_testing(g, "toy.testing") == {"toy/left.py imports toy.testing": "line 2"}
    assert torch_distributed_imports(g, TOY_LAYERS, ("low",)) == {"toy/low.py imports torch.distributed": "line 2, 4"}
    assert unplaced(g, TOY_LAYERS) == ["toy/testing.py"]


# ---- commands that need no torch start without it ---------------------------------------------------
TORCH_FREE = {  # neo-train command line -> its exit status; each run in a fresh interpreter
    "config": 0,
    "simulate --nodes 16 --network fattree --allreduce ring --tables 20": 0,
    "simulate --nodes 16 --network opera --allreduce ring --compute fwd=1": 2,  # an error, said in one line
    "replay": 2,  # argparse's usage error: the parser itself imports no torch
}


@pytest.mark.parametrize("argv", list(TORCH_FREE))
def test_config_simulate_and_the_parser_never_import_torch(argv):
    """``neo-train config`` and ``simulate`` (and every command's parser) run without importing
    torch, which takes seconds to import (``cli.main`` imports each command's module when it runs,
    and looks up the error classes of ``neo_train.comm`` and ``neo_train.train`` only where the
    command loaded them). Without that, ``simulate`` of a small cluster took 3.4 s, 0.8 s with it."""
    import subprocess
    import sys

    code = ("import sys\nfrom neo_train.cli import main\n"
            f"rc = main({argv.split()!r})\n"
            "sys.stdout.flush()\n"
            "print('RC', rc, 'TORCH', sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    last = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr
    assert last == f"RC {TORCH_FREE[argv]} TORCH []", (argv, last, out.stderr[-2000:])
    if TORCH_FREE[argv] == 2 and argv != "replay":
        assert out.stderr.startswith("neo-train: error: ") and out.stderr.count("\n") == 1, out.stderr
