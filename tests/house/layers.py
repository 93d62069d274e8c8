"""The import graph of the ledger package, read from the AST (nothing is imported)."""

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "ledger"

# Floors, top to bottom (docs/architecture.md): an import never points to a higher floor.
FLOORS = (
    ("cli", "demo"),
    ("api",),
    ("image",),
    ("cycle", "diff", "experience", "lineage", "integrations", "adopt", "checkout"),
    ("train",),
    ("gate",),
    ("plan",),
    ("artefacts",),
    ("sharing", "verdicts", "sandbox", "kernels", "capabilities", "report", "records", "runs", "options", "generations"),
    ("store",),
    ("errors", "__init__", "__main__"),
)
FLOOR = {room: len(FLOORS) - i for i, rooms in enumerate(FLOORS) for room in rooms}


@dataclass(frozen=True)
class Import:
    source: str      # importing module, dotted
    target: str      # imported ledger module or package, dotted
    line: int
    top: bool        # at module level (not inside a function or class body)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def room(dotted: str) -> str:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    # `from ledger.x import y` may name a module y: count both ledger.x and ledger.x.y
    out = [prefix]
    for alias in node.names:
        candidate = f"{prefix}.{alias.name}"
        if (PACKAGE.parent / candidate.replace(".", "/")).with_suffix(".py").exists() or \
                (PACKAGE.parent / candidate.replace(".", "/") / "__init__.py").exists():
            out.append(candidate)
    return out


def imports() -> list[Import]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        tree = ast.parse(path.read_bytes(), filename=str(path))
        top_level = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                targets = _resolve(module, path.name == "__init__.py", node)
            else:
                continue
            for t in targets:
                if t == "ledger" or t.startswith("ledger."):
                    found.append(Import(module, t, node.lineno, id(node) in top_level))
    return found


def third_party(path: Path) -> list[tuple[str, int, bool]]:
    """(top-level module name, line, at module level) of every non-ledger import in a file."""
    tree = ast.parse(path.read_bytes(), filename=str(path))
    top_level = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name.split(".")[0], node.lineno, id(node) in top_level) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.append((node.module.split(".")[0], node.lineno, id(node) in top_level))
    return [o for o in out if o[0] != "ledger"]


# Third-party modules whose import costs start-up time that the light commands (`ledger --help`,
# `ledger log`) must not pay: measured on the 2-core box with `python -X importtime -c "import m"`
# (torch ~1.5 s, transformers ~1 s, peft ~1.2 s with torch, s3fs 0.26 s, gguf 0.15 s, pyarrow
# 0.14 s, numpy 0.10 s, duckdb 0.08 s, typer 0.04 s, wasmtime 0.04 s, rich.console 0.04 s).
# Only these, and ledger modules that import one of them at module level, may be imported inside
# a function. Everything else (the standard library, blake3, ledger's light modules) is imported
# at the top of the module, where a reader looks for it.
HEAVY = frozenset({
    "torch", "transformers", "peft", "safetensors", "tokenizers", "pyarrow", "duckdb", "numpy",
    "wasmtime", "cupy", "cupy_backends", "gguf", "s3fs", "fsspec", "botocore", "moto", "triton",
    "rich", "typer", "click", "cryptography", "lightning", "bitsandbytes", "liger_kernel", "scipy",
    "jinja2", "tokenizers", "accelerate",
})


def module_path(dotted: str) -> Path | None:
    base = PACKAGE.parent / dotted.replace(".", "/")
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.exists():
            return p
    return None


def heavy_modules() -> set[str]:
    """ledger modules that import a HEAVY module at module level, directly or through ledger."""
    edges: dict[str, set[str]] = {}
    heavy: set[str] = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        m = module_name(path)
        edges.setdefault(m, set())
        if any(top and name in HEAVY for name, _, top in third_party(path)):
            heavy.add(m)
    for i in imports():
        if i.top:
            edges.setdefault(i.source, set()).add(i.target)
    changed = True
    while changed:
        changed = False
        for m, targets in edges.items():
            if m not in heavy and targets & heavy:
                heavy.add(m)
                changed = True
    return heavy


def cycles() -> list[list[str]]:
    """Strongly connected components (size > 1) of the module import graph, every import counted,
    an import of a module's own parent package left out (that is how a package exposes its parts)."""
    graph: dict[str, set[str]] = {}
    for i in imports():
        if i.source.startswith(i.target + ".") or i.target == i.source:
            continue
        if module_path(i.target) is None:
            continue
        graph.setdefault(i.source, set()).add(i.target)
        graph.setdefault(i.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    import sys
    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out
