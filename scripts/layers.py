#!/usr/bin/env python3
"""Checks that the files of each crate import one another without circles.

For every file of each member's `src` (crates/*, apps/*, bench) it collects the files its non-test code names through
`crate::…`, `super::…` and `self::…` paths (imports and qualified names alike), then looks
for a cycle in that graph. Test modules (`#[cfg(test)]` items and `mod tests`) are left out:
tests may reach across layers. Prints each cycle found and exits 1; otherwise prints one line
per crate with its file count.

    scripts/layers.py            # every crate
    scripts/layers.py --graph    # also print each file's imports
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
GROUP = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^{}]*)\}")


def strip_tests(text):
    """The text without comments, string literals and test-only items."""
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    out, i = [], 0
    marker = re.compile(r"#\[cfg\((?:test|all\(test[^)]*\))\)\]|\bmod tests\s*\{")
    while True:
        m = marker.search(text, i)
        if not m:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i : m.start()])
        # Skip the item: up to its `;` or its balanced `{ … }`, whichever comes first.
        j, depth = m.end(), (1 if m.group(0).endswith("{") else 0)
        while j < len(text):
            c = text[j]
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    j += 1
                    break
            elif c == ";" and depth == 0:
                j += 1
                break
            j += 1
        i = j


def module_of(src, path):
    """The module path of a file, e.g. ['wire', 'decode'] for src/wire/decode.rs."""
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts.pop()
    return parts


def file_of(modules, parts):
    """The file that defines the longest prefix of `parts` that names a module."""
    for n in range(len(parts), -1, -1):
        if tuple(parts[:n]) in modules:
            return modules[tuple(parts[:n])]
    return None


def check(crate):
    src = crate / "src"
    files = sorted(src.rglob("*.rs"))
    if (src / "lib.rs").exists() and (src / "main.rs") in files:
        # A binary beside the library is a crate of its own, which reaches the library by name.
        files.remove(src / "main.rs")
    modules = {tuple(module_of(src, f)): f for f in files}
    graph = {}
    for f in files:
        here = module_of(src, f)
        if f.name not in ("mod.rs", "lib.rs", "main.rs"):
            parent = here[:-1]
        else:
            parent = here[:-1] if here else []
        text = strip_tests(f.read_text())
        paths = []
        for m in GROUP.finditer(text):
            for item in m.group(3).split(","):
                item = item.strip().split(" as ")[0].strip()
                if item:
                    paths.append((m.group(1), m.group(2) + "::" + item))
        paths += [(m.group(1), m.group(2)) for m in PATH.finditer(text)]
        targets = set()
        for root, rest in paths:
            names = [p for p in rest.split("::") if p]
            if root == "crate":
                base = []
            elif root == "self":
                base = here
            else:  # super, possibly repeated
                base = parent
                while names and names[0] == "super":
                    base, names = base[:-1], names[1:]
            target = file_of(modules, base + names)
            if target is not None and target != f:
                targets.add(target)
        graph[f] = targets
    return src, graph


def cycles(graph):
    """One cycle per strongly connected component larger than a file (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
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
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return found


def main():
    show = "--graph" in sys.argv[1:]
    bad = False
    members = sorted([*(ROOT / "crates").iterdir(), *(ROOT / "apps").iterdir(), ROOT / "bench"])
    for crate in members:
        if not (crate / "src").is_dir():
            continue
        src, graph = check(crate)
        if show:
            for f, targets in sorted(graph.items()):
                names = " ".join(str(t.relative_to(src)) for t in sorted(targets))
                print(f"  {f.relative_to(src)} -> {names}")
        found = cycles(graph)
        for component in found:
            bad = True
            names = ", ".join(str(f.relative_to(src)) for f in component)
            print(f"{crate.name}: files that import one another in a circle: {names}")
        if not found:
            print(f"{crate.name}: {len(graph)} files, no import circle")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
