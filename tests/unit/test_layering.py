"""The import graph of ``ringtrain``: no module cycles, and every arrow allowed by the layer table.

The graph is read from the source with :mod:`ast`, so it sees every import statement at any
depth: module level, function-local (deferred for start-up time, still a dependency) and under
``if TYPE_CHECKING:``. Type-only imports count too, for cycles as well as for layers: they never
run, so they cannot break import order, but they are the usual way to hide a cycle from the
interpreter, and the two modules still cannot be understood or changed apart. Counting them
keeps "one way" true of the design, not just of what Python executes.

Two kinds of dependency are deliberately not arrows: a submodule's implicit import of its parent
packages (every module would otherwise depend on its package's re-exports), and the ``ringtrain``
dispatcher's ``importlib.import_module`` of a command group by name, which is the top of the stack.

The tree checked is the one ``import ringtrain`` finds. To check another checkout, copy this file
out of the repository (run from inside it, pytest puts the repository first on ``sys.path``) and
run it with ``PYTHONPATH`` set to that checkout.
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

import ringtrain

ROOT = Path(ringtrain.__file__).parent

#: Units of the layer table and the modules each covers (the longest matching prefix wins; a
#: prefix covers the module of that name and everything below it).
UNITS: dict[str, tuple[str, ...]] = {
    "leaf": ("ringtrain.__init__", "ringtrain.errors", "ringtrain.op_types",
             "ringtrain.log_level", "ringtrain.proc_stat", "ringtrain.shm_names",
             # the files `ringtrain run` writes and the job service reads
             "ringtrain.run_files",
             # the one checker of a record's fields (run files, job runner records, the env)
             "ringtrain.record_fields",
             # threads per rank: the task wrapper's and a Ray node's rule alike
             "ringtrain.runner.threads"),
    "backends": ("ringtrain.backends",),
    "engine.config": ("ringtrain.engine.config",),
    "engine": ("ringtrain.engine",),
    "torch": ("ringtrain.torch",),
    "keras": ("ringtrain.keras",),
    "compat": ("ringtrain.compat",),
    # what launcher and workers share: the worker env, the elastic rendezvous keys, slots
    "contract": ("ringtrain.contract",),
    "runner": ("ringtrain.runner",),
    # The job service: its folders are its layers. `jobs.errors` is the hierarchy every layer
    # raises; `files/` the one safe way to read what a job left; the package's own modules and
    # `models/` what client and service share; then `client/`, `service/` (with its `store/`,
    # `monitor/` and, on top, `api/`) and `cli/` over both.
    "jobs.errors": ("ringtrain.jobs.errors",),
    "jobs.files": ("ringtrain.jobs.files",),
    "jobs": ("ringtrain.jobs",),
    "jobs.client": ("ringtrain.jobs.client",),
    "jobs.cli": ("ringtrain.jobs.cli",),
    "jobs.service.store": ("ringtrain.jobs.service.store",),
    "jobs.service.monitor": ("ringtrain.jobs.service.monitor",),
    "jobs.service": ("ringtrain.jobs.service",),
    "jobs.service.api": ("ringtrain.jobs.service.api",),
    # object storage: URLs, the node cache, transfers; below the job service and the server
    "storage": ("ringtrain.storage",),
    "data": ("ringtrain.data",),
    "doctor": ("ringtrain.doctor",),
    "models": ("ringtrain.models",),
    "web": ("ringtrain.web",),
    "serve.cli": ("ringtrain.serve.cli", "ringtrain.serve.job_model",
                  "ringtrain.serve.store_model"),
    "serve": ("ringtrain.serve",),
    "cli": ("ringtrain.cli", "ringtrain.env_report"),
}

#: What each unit may import besides itself. Everything else is forbidden; in particular nothing
#: imports upward (``backends`` -> ``engine``, ``engine`` -> ``runner``), ``runner`` imports
#: neither the torch frontend nor the engine (only its pure config type), the frontends import
#: ``contract`` and never ``runner``, and ``jobs`` imports no part of training (it starts
#: training through ``ringtrain run`` in a subprocess).
ALLOWED: dict[str, tuple[str, ...]] = {
    "leaf": (),
    "backends": ("leaf",),
    "engine.config": ("leaf",),
    "engine": ("engine.config", "backends", "leaf"),
    "torch": ("engine", "engine.config", "backends", "contract", "leaf"),
    "keras": ("torch", "engine", "engine.config", "backends", "contract", "leaf"),
    "compat": ("torch", "keras", "leaf"),
    "contract": ("engine.config", "leaf"),
    "runner": ("contract", "engine.config", "leaf"),
    "jobs.errors": ("leaf",),
    "jobs.files": ("jobs.errors", "leaf"),
    "jobs": ("jobs.files", "jobs.errors", "leaf"),
    # the client never imports the service, nor the service the client
    "jobs.client": ("jobs", "jobs.files", "jobs.errors", "leaf"),
    "jobs.service.store": ("jobs", "jobs.errors", "leaf"),
    # what the dashboard reads from jobs' folders and processes: below the service it serves
    "jobs.service.monitor": ("jobs", "jobs.files", "jobs.errors", "leaf"),
    "jobs.service": ("jobs.service.store", "jobs.service.monitor", "jobs", "jobs.files",
                     "jobs.errors", "storage", "web", "leaf"),
    "jobs.service.api": ("jobs.service", "jobs.service.store", "jobs.service.monitor", "jobs",
                         "jobs.files", "jobs.errors", "storage", "web", "leaf"),
    # `ringtrain server` runs the service; every other command goes through the client
    "jobs.cli": ("jobs.client", "jobs.service.api", "jobs.service", "jobs", "jobs.files",
                 "jobs.errors", "storage", "web", "leaf"),
    "data": ("torch", "models", "leaf"),
    "doctor": ("data", "torch", "models", "contract", "leaf"),
    "models": ("leaf",),
    "storage": ("leaf",),
    "web": ("leaf",),
    "serve": ("models", "storage", "web", "leaf"),
    # `ringtrain serve JOB_ID` asks the job service for the job's model; the server never does.
    "serve.cli": ("serve", "jobs.client", "jobs", "jobs.errors", "models", "storage", "web",
                  "leaf"),
    "cli": ("leaf",),
}

#: Units that must import nothing but the standard library and each other: the runner and the
#: engine share ``engine.config`` only because it pulls in neither torch nor the engine, and the
#: launcher and its workers share ``contract`` only because it pulls in neither side.
STDLIB_ONLY = ("leaf", "engine.config", "contract")
#: The frontends, which run in the workers: they learn their place from ``contract`` and never
#: import the launcher (``ringtrain.runner``), at any depth.
FRONTENDS = ("torch", "keras", "compat", "data", "doctor")
#: Third-party packages a unit must never import, at any depth.
FORBIDDEN_PACKAGES: dict[str, tuple[str, ...]] = {
    unit: ("torch",) for unit in (*(u for u in UNITS if u == "jobs" or u.startswith("jobs.")),
                                  "storage", "web")
}


def module_name(path: Path, root: Path = ROOT) -> str:
    """The dotted name of a source file under ``root`` (a package's ``__init__`` keeps that part,
    so that a prefix of ``UNITS`` can name a package's own module apart from its submodules)."""
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts)


def _shim_alias(name: str, root: Path) -> str:
    """A ``horovod.*`` import as the ``ringtrain.compat.shim.horovod.*`` file that serves it.

    ``ringtrain run --horovod-compat`` puts ``compat/shim`` first on the workers' ``PYTHONPATH``,
    so the shim's modules import each other by their ``horovod.*`` names.
    """
    if name == "horovod" or name.startswith("horovod."):
        return f"{root.name}.compat.shim.{name}"
    return name


def import_targets(tree: ast.Module, importer: str, modules: set[str],
                   root: Path = ROOT) -> tuple[set[str], set[str]]:
    """The modules of ``modules`` that one module imports, and the top-level packages outside it.

    Args:
        tree: the parsed module.
        importer: its name as :func:`module_name` gives it.
        modules: every module name of the tree.
        root: the package directory the names are relative to.

    Returns:
        ``(internal, external)``: internal targets by their :func:`module_name`; external ones by
        their top-level package name.
    """
    package = (importer.removesuffix(".__init__") if importer.endswith(".__init__")
               else importer.rsplit(".", 1)[0])
    internal: set[str] = set()
    external: set[str] = set()

    def resolve(dotted: str) -> None:
        dotted = _shim_alias(dotted, root)
        top = dotted.split(".")[0]
        if top != root.name:
            external.add(top)
            return
        parts = dotted.split(".")
        for end in range(len(parts), 0, -1):  # the deepest module the name reaches
            candidate = ".".join(parts[:end])
            for name in (candidate, candidate + ".__init__"):
                if name == importer:
                    return
                if name in modules:
                    internal.add(name)
                    return

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                resolve(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            for alias in node.names:
                # `from pkg import sub` imports the submodule when there is one.
                sub = _shim_alias(f"{stem}.{alias.name}", root)
                if alias.name != "*" and (sub in modules or sub + ".__init__" in modules):
                    resolve(sub)
                else:
                    resolve(stem)
    return internal, external


def read_graph(root: Path = ROOT) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Every module of the package at ``root`` and what it imports.

    Returns:
        ``(graph, external)``: module -> the package's modules it imports, and module -> the
        top-level names of everything else it imports.
    """
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    modules = set(files)
    graph: dict[str, set[str]] = {}
    external: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        graph[name], external[name] = import_targets(tree, name, modules, root)
    return graph, external


@functools.cache
def _package_graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """:func:`read_graph` of the package ``import ringtrain`` finds, read once for the tests
    here (a read parses every module: ~1 s a test on a loaded 2-core machine); callers only
    read it."""
    return read_graph()


def unit_of(module: str) -> str | None:
    """The unit of the layer table that covers ``module`` (``None`` if no prefix does)."""
    best: tuple[int, str] | None = None
    for unit, prefixes in UNITS.items():
        for prefix in prefixes:
            covers = module == prefix or (not prefix.endswith(".__init__")
                                          and module.startswith(prefix + "."))
            if covers and (best is None or len(prefix) > best[0]):
                best = (len(prefix), unit)
    return None if best is None else best[1]


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected component that has one.

    Returns:
        Each cycle as a path that starts and ends with the same module.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def connect(v: str) -> None:  # Tarjan's algorithm; the graph has ~100 nodes
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return [_cycle_within(c, graph) for c in components]


def _cycle_within(component: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest cycle through the first module of a strongly connected component."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{sorted(component)} is not strongly connected")


def _table() -> str:
    width = max(map(len, ALLOWED))
    rows = [f"  {unit:<{width}}  may import  {', '.join(allowed) or '(nothing)'}"
            for unit, allowed in ALLOWED.items()]
    units = [f"  {unit:<{width}}  = {', '.join(prefixes)}" for unit, prefixes in UNITS.items()]
    return "\n".join(["layer table (see docs/architecture.md):", *rows, "units:", *units])


def test_no_module_imports_another_that_imports_it_back():
    graph, _ = _package_graph()
    cycles = find_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join("  " + " -> ".join(c) for c in cycles)


def test_the_layer_table_points_one_way():
    allowed = {unit: set(targets) for unit, targets in ALLOWED.items()}
    assert set(ALLOWED) == set(UNITS)
    assert not find_cycles(allowed), f"the table allows a cycle:\n{_table()}"


def test_every_module_belongs_to_a_unit_of_the_layer_table():
    graph, _ = _package_graph()
    unassigned = sorted(m for m in graph if unit_of(m) is None)
    assert not unassigned, f"modules no unit covers: {unassigned}\n{_table()}"


def test_the_job_service_layers_are_its_folders():
    """Every unit of ``jobs/`` but its error hierarchy is a folder: a reader finds a module's layer
    by its path, and a new module joins the layer of the folder it is put in."""
    jobs = [u for u in UNITS if u == "jobs" or u.startswith("jobs.")]
    assert {"jobs", "jobs.files", "jobs.client", "jobs.service", "jobs.cli"} <= set(jobs)
    for unit in jobs:
        for prefix in UNITS[unit]:
            folder = ROOT.parent.joinpath(*prefix.split("."))
            if unit != "jobs.errors":
                assert (folder / "__init__.py").is_file(), f"unit {unit}: {prefix} is no folder"


def test_every_import_points_down_the_layer_table():
    graph, _ = _package_graph()
    broken = []
    for importer, targets in sorted(graph.items()):
        source = unit_of(importer)
        for target in sorted(targets):
            dest = unit_of(target)
            if source is not None and dest not in (source, *ALLOWED[source]):
                broken.append(f"  {importer} ({source}) -> {target} ({dest})")
    assert not broken, "imports that break the layer table:\n" + "\n".join(broken) + \
        "\n" + _table()


def test_units_stay_clear_of_packages_they_must_not_pull_in():
    graph, external = _package_graph()
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    pure = {m for m in graph if unit_of(m) in STDLIB_ONLY}
    # Importing a module runs its packages' __init__ first: they must be as light.
    pure |= {".".join(m.split(".")[:end]) + ".__init__"
             for m in pure for end in range(1, len(m.removesuffix(".__init__").split(".")))}
    broken = []
    for module in sorted(graph):
        unit = unit_of(module)
        for name in sorted(external[module]):
            if name in FORBIDDEN_PACKAGES.get(unit, ()) or (module in pure and name not in stdlib):
                broken.append(f"  {module} ({unit}) imports {name}")
        if module in pure:
            broken += [f"  {module} ({unit}) imports {target}"
                       for target in sorted(graph[module]) if target not in pure]
    assert not broken, ("imports that pull in too much (only the standard library and leaf "
                        f"modules in {', '.join(STDLIB_ONLY)} and their packages' __init__; no "
                        "torch in jobs):\n" + "\n".join(broken))


def test_the_frontends_never_import_the_launcher():
    graph, _ = _package_graph()
    broken = []
    for module in sorted(m for m in graph if unit_of(m) in FRONTENDS):
        seen = {module: [module]}
        frontier = [module]
        while frontier:  # everything the module imports, at any depth, with the way there
            nxt = []
            for v in frontier:
                for w in sorted(graph[v]):
                    if w not in seen:
                        seen[w] = seen[v] + [w]
                        nxt.append(w)
            frontier = nxt
        for target, path in sorted(seen.items()):
            if target.startswith("ringtrain.runner.") and unit_of(target) != "leaf":
                broken.append("  " + " -> ".join(path))
    assert not broken, ("the frontends reach the launcher (what they share with it belongs in "
                        "ringtrain/contract/):\n" + "\n".join(broken))


def test_the_reader_sees_deferred_and_type_only_imports_and_reports_their_cycle(tmp_path):
    pkg = tmp_path / "ringtrain"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from ringtrain.sub import b\n")
    (pkg / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ringtrain import c\n")
    (pkg / "c.py").write_text("def f():\n    from . import a\n    import numpy\n")
    graph, external = read_graph(pkg)
    assert graph["ringtrain.a"] == {"ringtrain.sub.b"}
    assert graph["ringtrain.sub.b"] == {"ringtrain.c"}
    assert graph["ringtrain.c"] == {"ringtrain.a"}
    assert external["ringtrain.c"] == {"numpy"}
    assert find_cycles(graph) == [["ringtrain.a", "ringtrain.sub.b", "ringtrain.c", "ringtrain.a"]]
