"""Dependencies point one way (docs/design.md §6.1), read from the source with ``ast``: every
import statement counts, the lazy ones inside functions included."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: Packages whose code must import nothing from privsched but these units.
PURE = {"privsched.budgets": {"privsched.errors"}, "privsched.policies": {"privsched.budgets", "privsched.errors"}}
#: The applications at the top that may use the reference workloads directly.
ABOVE_WORKLOADS = {"privsched.demo"}


def unit(module: str) -> str | None:
    """The unit an import belongs to: ``workloads``, ``privsched.<package or module>``,
    or None for anything outside the project."""
    parts = module.split(".")
    if parts[0] == "workloads":
        return "workloads"
    if parts[0] != "privsched":
        return None
    return ".".join(parts[:2])


def imports(path: Path, module: str) -> list[str]:
    """The absolute module names every import statement of a file names."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            names.append(".".join(base + ([node.module] if node.module else [])))
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


def import_graph() -> dict[str, set[str]]:
    """Unit -> the other units its files import."""
    graph: dict[str, set[str]] = defaultdict(set)
    for path in sorted([*REPO.glob("privsched/**/*.py"), *REPO.glob("workloads/**/*.py")]):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        source = unit(module)
        for name in imports(path, module):
            target = unit(name)
            if target not in (None, source, "privsched"):
                graph[source].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one unit (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_lazy_and_relative_imports() -> None:
    graph = import_graph()
    assert "privsched.policies" in graph["privsched.service"]  # a top-level import
    assert "privsched.simulation" in graph["privsched.cli"]  # imported inside command bodies only


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_between_privsched_packages_or_with_workloads() -> None:
    assert cycles(import_graph()) == []


def test_the_trainers_use_the_job_contract_and_jobs_import_no_trainer() -> None:
    graph = import_graph()
    assert "privsched.jobs" in graph["privsched.trainers"]
    assert "privsched.trainers" not in graph["privsched.jobs"]


def test_neither_client_imports_the_other_and_the_local_client_does_not_import_the_server() -> None:
    graph = import_graph()
    assert not {"privsched.remote", "privsched.server"} & graph["privsched.client"]
    assert "privsched.client" not in graph["privsched.remote"]


@pytest.mark.parametrize("package", sorted(PURE))
def test_budgets_and_policies_import_nothing_from_the_rest_of_privsched(package: str) -> None:
    assert import_graph()[package] <= PURE[package]


def test_privsched_depends_on_workloads_only_in_its_applications() -> None:
    users = {source for source, targets in import_graph().items() if "workloads" in targets}
    assert users <= ABOVE_WORKLOADS
    assert "privsched.simulation" in import_graph()["workloads"]
