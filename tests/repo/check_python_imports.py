#!/usr/bin/env python3
"""The modules of the Python package (python/wush) import each other without a cycle.

Each import of a package module is an arrow from the importing module to the imported one
(`from . import hf` and `from .hf import x` both point to wush.hf; `from . import name` where the
package has no module of that name points to the package itself, its __init__). Rules:
  1. the imports that run when a module is imported (module level, class bodies included) form
     no cycle: a cycle there hands one module the other half-initialized;
  2. neither do all imports together, function-local (lazy) ones included: a lazy import that
     closes a cycle hides the same tangle until the function runs. Such an arrow is allowed only
     when LAZY_ALLOWED names it, with the reason (none is needed today).
Usage:
  check_python_imports.py [PACKAGE_DIR]   checks python/wush (default: the one beside tests/);
                                          prints each cycle, exits 1 if there is one
  check_python_imports.py --self-test     shows that each rule fails on a package that breaks it
"""
import ast
import os
import sys
import tempfile

# (importing module, imported module) -> why the function-local import may close a cycle.
LAZY_ALLOWED = {}

PACKAGE = "__init__"


def modules(pkg):
    return sorted(n[:-3] for n in os.listdir(pkg) if n.endswith(".py"))


def imports(pkg, name, known):
    """(imported module, lazy) for each import of a package module in ``name``.py."""
    with open(os.path.join(pkg, name + ".py"), encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=name + ".py")
    top = os.path.basename(os.path.abspath(pkg))
    out = []

    def visit(node, lazy):
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.ImportFrom):
                out.extend((m, inner) for m in targets_from(child, top, known))
            elif isinstance(child, ast.Import):
                for a in child.names:
                    parts = a.name.split(".")
                    if parts[0] == top:
                        out.append((parts[1] if len(parts) > 1 and parts[1] in known else PACKAGE, inner))
            visit(child, inner)

    visit(tree, False)
    return out


def targets_from(node, top, known):
    """The package modules a `from ... import ...` reaches."""
    if node.level == 0:
        parts = (node.module or "").split(".")
        if parts[0] != top:
            return []
        rest = parts[1:]
    elif node.level == 1:
        rest = node.module.split(".") if node.module else []
    else:
        return []  # above the package
    if rest:
        return [rest[0] if rest[0] in known else PACKAGE]
    return [a.name if a.name in known else PACKAGE for a in node.names]


def graph(pkg, with_lazy):
    known = set(modules(pkg))
    edges = {m: set() for m in known}
    for m in known:
        for target, lazy in imports(pkg, m, known):
            if target == m or (lazy and not with_lazy) or (lazy and (m, target) in LAZY_ALLOWED):
                continue
            edges[m].add(target)
    return edges


def cycles(edges):
    """One cycle (a list of modules, first repeated last) per strongly connected tangle."""
    found, state = [], {}

    def dfs(node, path):
        state[node] = "open"
        path.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                dfs(nxt, path)
        path.pop()
        state[node] = "done"

    for n in sorted(edges):
        if n not in state:
            dfs(n, [])
    return found


def check(pkg):
    problems = []
    for with_lazy, what in ((False, "module-level imports"), (True, "imports, function-local ones included")):
        for c in cycles(graph(pkg, with_lazy)):
            problems.append(f"{os.path.basename(os.path.abspath(pkg))}: a cycle of {what}: {' -> '.join(c)}")
        if problems:
            break  # a module-level cycle is one of all imports as well
    return problems


def self_test():
    cases = {  # name -> ({module: text}, the number of problems expected)
        "acyclic": ({"__init__": "from . import a\n", "a": "from . import b\n", "b": "import os\n",
                     "c": "def f():\n    from .a import x\n"}, 0),
        "module-level cycle": ({"__init__": "", "a": "from .b import x\n", "b": "from . import a\n"}, 1),
        "cycle through a class body": ({"__init__": "", "a": "class A:\n    from .b import x\n",
                                        "b": "import pkg.a\n"}, 1),
        "lazy cycle": ({"__init__": "", "a": "from . import b\n", "b": "def f():\n    from .a import x\n"}, 1),
        "cycle through the package": ({"__init__": "from . import a\n", "a": "from . import version\n"}, 1),
    }
    failed = 0
    for name, (files, expected) in cases.items():
        with tempfile.TemporaryDirectory() as tmp:
            pkg = os.path.join(tmp, "pkg")
            os.mkdir(pkg)
            for module, text in files.items():
                with open(os.path.join(pkg, module + ".py"), "w", encoding="utf-8") as f:
                    f.write(text)
            got = check(pkg)
        ok = len(got) == expected
        failed += not ok
        print(f"{'ok' if ok else 'FAILED'}: {name}: {len(got)} problem(s), expected {expected} {got}")
    return 1 if failed else 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    pkg = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "python", "wush")
    problems = check(pkg)
    for p in problems:
        print(p)
    print(f"{len(modules(pkg))} modules, {'no import cycle' if not problems else f'{len(problems)} cycle(s)'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
