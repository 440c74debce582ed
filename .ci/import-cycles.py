#!/usr/bin/env python3
"""Import cycles among a crate's modules (ARCHITECTURE.md "Layers").

Usage: import-cycles.py SRC_DIR [--top] [--check]
Reads every `crate::a::b` path in the non-test code of each file under SRC_DIR, resolves it to
the deepest module that exists, and prints each strongly connected group of modules (a cycle).
--top collapses modules to their top-level module first; --check exits 1 when a cycle exists.
"""
import os, re, sys

def modules(src):
    mods = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(root, f)
            rel = os.path.relpath(path, src)[:-3].split(os.sep)
            if rel[-1] in ("mod", "lib", "main"):
                rel = rel[:-1]
            mods["::".join(rel)] = path
    return mods

def deps(mods, top):
    out = {}
    for m, path in mods.items():
        text = open(path, encoding="utf-8").read()
        text = text.split("#[cfg(test)]")[0]
        text = re.sub(r"//[^\n]*", "", text)  # comments and docs name modules without using them
        found = set()
        for ref in re.findall(r"crate((?:::[a-z_][a-z0-9_]*)+)", text):
            parts = ref.strip(":").split("::")
            for n in range(len(parts), 0, -1):
                cand = "::".join(parts[:n])
                if cand in mods:
                    found.add(cand)
                    break
        # `use super::x` inside a module file
        for ref in re.findall(r"super::([a-z_][a-z0-9_]*)", text):
            parent = m.rsplit("::", 1)[0] if "::" in m else ""
            cand = f"{parent}::{ref}" if parent else ref
            if cand in mods:
                found.add(cand)
        if top:
            m = m.split("::")[0]
            found = {d.split("::")[0] for d in found}
        out.setdefault(m, set()).update(d for d in found if d != m and d)
    return out

def sccs(g):
    index, low, stack, on, out, i = {}, {}, [], set(), [], [0]
    def visit(v):
        index[v] = low[v] = i[0]; i[0] += 1; stack.append(v); on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    sys.setrecursionlimit(10000)
    for v in list(g):
        if v not in index:
            visit(v)
    return out

if __name__ == "__main__":
    src = sys.argv[1]
    cycles = sccs(deps(modules(src), "--top" in sys.argv))
    for c in cycles:
        print("cycle:", " <-> ".join(c))
    if not cycles:
        print(f"{src}: no import cycle")
    sys.exit(1 if cycles and "--check" in sys.argv else 0)
