"""The house rules of docs/design.md, checked on the source: layering, no import circle, sizes, settings."""

import ast
import pathlib
import re

import pytest

import ringtree

PACKAGE = pathlib.Path(ringtree.__file__).parent
MODULES = {".".join(("ringtree", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__"): path
           for path in sorted(PACKAGE.rglob("*.py"))}
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


def _imports(name: str) -> set[str]:
    """The ringtree modules that module `name` imports, at any depth of its code."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            module = node.module if node.level == 0 else ".".join(filter(None, (base, node.module)))
            # `from package import name` imports the submodule where there is one
            found.update(f"{module}.{alias.name}" if f"{module}.{alias.name}" in MODULES else module
                         for alias in node.names)
    return {module for module in found if module in MODULES}


def _external(name: str) -> set[str]:
    """The top-level packages outside ringtree that module `name` imports."""
    found = set()
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.add(node.module.split(".")[0])
    return found - {"ringtree"}


@pytest.mark.parametrize("name", [n for n in MODULES if n.startswith(("ringtree.algorithms", "ringtree.schedule"))])
def test_algorithms_and_schedule_import_neither_mpi_nor_an_array_library(name):
    assert not _external(name) & {"mpi4py", "numpy", "cupy", "torch"}
    assert all(module.startswith(("ringtree.algorithms", "ringtree.schedule")) for module in _imports(name))


def test_nothing_but_the_commands_imports_the_commands():
    importers = {name for name in MODULES if not name.startswith("ringtree.commands")
                 and any(module.startswith("ringtree.commands") for module in _imports(name))}
    assert importers == {"ringtree.__main__"}  # `python -m ringtree`, the commands' entry point


def test_no_module_imports_itself_through_others():
    graph = {name: _imports(name) for name in MODULES}
    circles = []

    def visit(name, path):
        for module in graph[name]:
            if module in path:
                circles.append(path[path.index(module):] + [module])
            elif module not in done:
                visit(module, path + [module])
        done.add(name)

    done: set[str] = set()
    for name in MODULES:
        if name not in done:
            visit(name, [name])
    assert circles == []


# The modules at the top of the package that the runtime may use: errors, ops, settings, logging, words.
FOUNDATION = {"ringtree.errors", "ringtree.ops", "ringtree.settings", "ringtree.debug", "ringtree.version",
              "ringtree.tensors", "ringtree.words"}


def _layer(name: str) -> str:
    """A module's layer: its subpackage (api/, the public API, among them), or the foundation; the rest of
    the top (the package itself, ringtree.allreduce and ringtree.torch) is the public API's face."""
    parts = name.split(".")
    if len(parts) > 2 or (len(parts) == 2 and MODULES[name].name == "__init__.py"):
        return parts[1]
    if name == "ringtree.__main__":
        return "commands"  # `python -m ringtree`: the commands' entry point
    return "foundation" if name in FOUNDATION else "api"


def test_no_layer_imports_itself_through_others():
    graph: dict[str, set[str]] = {}
    for name in MODULES:
        graph.setdefault(_layer(name), set()).update(_layer(module) for module in _imports(name))
    for layer, imported in graph.items():
        imported.discard(layer)
    circles = []

    def visit(layer, path):
        for other in sorted(graph[layer]):
            if other in path:
                circles.append(path[path.index(other):] + [other])
            else:
                visit(other, path + [other])

    for layer in graph:
        visit(layer, [layer])
    assert circles == []
    assert graph["runtime"] <= {"foundation", "algorithms", "schedule", "tuning"}  # never the public API
    assert "api" not in graph["foundation"]


def test_the_public_api_is_a_package_and_the_top_the_foundation():
    top = {name for name, path in MODULES.items() if name.count(".") == 1 and path.name != "__init__.py"}
    # ringtree.allreduce and ringtree.torch: the import paths users have, of api's modules
    assert top - FOUNDATION == {"ringtree.__main__", "ringtree.allreduce", "ringtree.torch"}
    for name in ("ringtree.allreduce", "ringtree.torch"):
        body = ast.parse(MODULES[name].read_text()).body
        assert all(isinstance(node, ast.ImportFrom) and node.module.startswith("api.") for node in body
                   if not isinstance(node, (ast.Expr, ast.Assign))), name


def test_every_algorithm_has_one_registry_entry_and_fits_the_signature():
    from ringtree.algorithms import ALGORITHMS, GENERATORS, REGISTRY, SHIPPED
    from ringtree.runtime.safety.mismatch import PROGRAMS

    for collective, entries in REGISTRY.items():
        assert all(entry.name == name for name, entry in entries.items())
        assert len(SHIPPED[collective]) + 1 <= PROGRAMS  # "auto" and each have a code, a program's own the last
        assert GENERATORS[collective] == {name: entry.generator for name, entry in entries.items()}
    assert ALGORITHMS == GENERATORS["allreduce"]


def _calls_in(name: str) -> dict[str, set[str]]:
    """Per function of module `name` (by its own name, nested ones apart), the names it calls."""
    found: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found[node.name] = {call.func.id if isinstance(call.func, ast.Name) else call.func.attr
                                for call in ast.walk(node) if isinstance(call, ast.Call)
                                and isinstance(call.func, (ast.Name, ast.Attribute))}
    return found


def test_every_collective_goes_one_call_path():
    # Rule 6: each public collective (blocking, nonblocking, persistent) ends in call_path.run; only the
    # path checks a call and builds its plan, and only plan.py makes a Plan.
    from ringtree.api import collectives

    publics = {"ringtree.api.allreduce": ["allreduce", "iallreduce"],
               "ringtree.api.collectives": [name for name in collectives.__all__ if not name.endswith("_init")]}
    for module, names in publics.items():
        functions = {node.name: node for node in ast.parse(MODULES[module].read_text()).body
                     if isinstance(node, ast.FunctionDef)}
        for name in names:
            last = functions[name].body[-1]
            assert isinstance(last, ast.Return) and isinstance(last.value, ast.Call), name
            assert getattr(last.value.func, "id", None) == "run", name
    builders = {name for name in MODULES if any("build_plan" in calls for calls in _calls_in(name).values())}
    assert builders == {"ringtree.api.call_path"}
    makers = {name for name in MODULES if any("Plan" in calls for calls in _calls_in(name).values())}
    assert makers == {"ringtree.runtime.session.plan"}
    checkers = {name for name in MODULES if any("checked_call" in calls for calls in _calls_in(name).values())}
    assert checkers <= {"ringtree.api.call_path", "ringtree.api.collectives", "ringtree.api.persistent"}  # the last two: *_init


def test_every_wait_backs_off_in_one_place():
    # Rule 7: only the one back-off sleeps or yields the core (the progress thread's polls too); the stall
    # watchdog, a thread of its own that waits for nothing, naps on its own clock.
    sleepers = {name for name in MODULES if not name.startswith("ringtree.commands")
                and any({"sleep", "sched_yield"} & calls for calls in _calls_in(name).values())}
    assert sleepers == {"ringtree.runtime.safety.backoff", "ringtree.runtime.safety.stalls"}


# runtime/'s rooms, each importing only from those before it (runtime/__init__.py says what each holds)
ROOMS = ["safety", "transports", "engine", "session", "checks"]


def test_the_runtime_s_rooms_import_one_way_and_hold_every_module():
    runtime = PACKAGE / "runtime"
    assert sorted(path.name for path in runtime.iterdir() if path.name != "__pycache__") == sorted(
        ["__init__.py", *ROOMS])
    backwards = []
    for name in MODULES:
        parts = name.split(".")
        if parts[1:2] != ["runtime"] or len(parts) < 3:
            continue
        room = ROOMS.index(parts[2])
        backwards += [(name, module) for module in _imports(name) if module.startswith("ringtree.runtime.")
                      and ROOMS.index(module.split(".")[2]) > room]
    assert backwards == []


def test_every_directory_of_modules_is_a_package_that_an_install_takes():
    # setup.cfg finds packages (directories with __init__.py): a directory without one is left out of a wheel
    directories = {path.parent for path in PACKAGE.rglob("*.py")}
    assert [str(directory) for directory in directories if not (directory / "__init__.py").exists()] == []


@pytest.mark.parametrize("name", MODULES)
def test_no_module_is_over_400_lines_and_no_function_over_80(name):
    source = MODULES[name].read_text()
    assert len(source.splitlines()) <= MAX_MODULE_LINES
    long = [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert long == []


def test_ringtree_variables_are_read_in_the_settings_module_only():
    readers = {name for name, path in MODULES.items()
               if re.search(r"\b(os\.environ|os\.getenv|environ\.get)\b", path.read_text())}
    assert readers == {"ringtree.settings"}


def test_the_package_exports_its_public_names():
    for name in ringtree.__all__:
        assert getattr(ringtree, name) is not None
    assert {"allreduce", "iallreduce", "Communicator", "GradientBucketer", "MismatchError", "TimeoutError",
            "PeerFailure"} <= set(ringtree.__all__)


@pytest.mark.mpi
def test_ringtree_allreduce_is_the_function_with_its_help_and_its_module_imports_as_before():
    import pydoc
    import sys

    import numpy as np
    from mpi4py import MPI

    import ringtree.allreduce
    from ringtree.allreduce import allreduce, iallreduce

    assert ringtree.allreduce is allreduce and sys.modules["ringtree.allreduce"].iallreduce is iallreduce
    shown = pydoc.render_doc(ringtree.allreduce, renderer=pydoc.plaintext)
    assert "function allreduce" in shown and "op=MPI.SUM" in shown and "object at 0x" not in shown
    comm = MPI.COMM_WORLD
    data = np.arange(6, dtype=np.int64)
    assert np.array_equal(ringtree.allreduce(data, comm=comm), data * comm.Get_size())
    assert ringtree.iallreduce(data, comm=comm).wait().tolist() == (data * comm.Get_size()).tolist()


# Rule 7: module-level state in api/ and runtime/ only for what is one per process by nature; a
# communicator's is its session's (CommState).
PER_PROCESS = {"ringtree.runtime.session.state.SESSIONS", "ringtree.runtime.safety.threads.THREADS",
               "ringtree.runtime.safety.stalls.WATCHDOG", "ringtree.runtime.engine.in_flight.IN_FLIGHT",
               "ringtree.runtime.engine.timeline.TIMELINE", "ringtree.runtime.transports.backend.REGISTERED",
               "ringtree.runtime.safety.failures._ENDING_THE_JOB", "ringtree.api.torch_tensors._VIEWS"}
MUTATORS = {"append", "add", "update", "pop", "clear", "setdefault", "discard", "remove", "extend", "popitem", "insert"}


def _root(node):
    """The name a chain of items and attributes (a[1].b) starts from, or None."""
    while isinstance(node, (ast.Subscript, ast.Attribute)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _written_at_module_level(name: str) -> set[str]:
    """The module-level names (module.name) that module `name`'s functions write: an item, an attribute,
    by a method that changes it, or `global`."""
    path = MODULES[name]
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    owners = {target.id: f"{name}.{target.id}" for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
              for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
              if isinstance(target, ast.Name)}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            module = ".".join(filter(None, (base, node.module)))
            owners.update({alias.asname or alias.name: f"{module}.{alias.name}" for alias in node.names})
    written = set()
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        arguments = function.args
        local = {a.arg for a in arguments.args + arguments.kwonlyargs + arguments.posonlyargs}
        local |= {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        declared = {g for n in ast.walk(function) if isinstance(n, ast.Global) for g in n.names}
        roots = set(declared)
        for node in ast.walk(function):
            targets = (node.targets if isinstance(node, (ast.Assign, ast.Delete)) else
                       [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
            for target in targets:
                for part in (target.elts if isinstance(target, ast.Tuple) else [target]):
                    if isinstance(part, (ast.Subscript, ast.Attribute)):
                        roots.add(_root(part))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
                roots.add(_root(node.func.value))
        written |= {owners[root] for root in roots if root in owners and (root not in local or root in declared)}
    return written


def test_module_level_state_is_only_what_is_one_per_process():
    written = set().union(*(_written_at_module_level(name) for name in MODULES
                            if name.startswith(("ringtree.api", "ringtree.runtime"))))
    assert written - PER_PROCESS == set()
