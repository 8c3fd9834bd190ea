#!/usr/bin/env python3
"""The largest import cycle among the files of each crate.

    tools/import_cycles.py [--max N] [CRATE_DIR...]   (default: every workspace member)

A file is a module (`a/b.rs` or `a/b/mod.rs` is `a::b`). File A depends on
file B when A names a path through `crate::` or `super::` that resolves to
B's module, in a `use` or inline, anywhere in the file; left out are the
items under `#[cfg(test)]` (inline test modules, test-only functions and
imports) and comments (doc links among them). A name the crate root
re-exports (`pub use error::{Error, ...}`)
resolves to the module its `pub use` names, so `crate::Error` is an edge to
`error.rs`, not to `lib.rs`. The cycles are the strongly connected
components of that graph; the script prints each crate's largest, with its
files. With `--max N`, it exits 1 when a crate's largest cycle has more
than N files (`.ci/run` passes 3).
"""
import re
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

ROOT_FILES = ("lib", "main", "mod")
# Comments, doc comments among them: a doc link is no dependency.
COMMENT = re.compile(r"//[^\n]*")
PATH = re.compile(r"\b(crate|super)((?:::\w+)+)")
GROUP = re.compile(r"\b(crate|super)((?:::\w+)*)::\{([^{}]*)\}")
TEST_ONLY = "#[cfg(test)]"
REEXPORT = re.compile(r"pub use ((?:\w+::)*\w+)::\{([^}]*)\}|pub use ((?:\w+::)*\w+)::(\w+);")


def without_test_items(text):
    """`text` without each item `#[cfg(test)]` marks: from the attribute
    through the item's `;` or its block's closing brace (braces counted,
    further attributes on the item included)."""
    kept, at = [], 0
    while (start := text.find(TEST_ONLY, at)) != -1:
        kept.append(text[at:start])
        depth, end = 0, start + len(TEST_ONLY)
        while end < len(text):
            char = text[end]
            end += 1
            if char == "[":
                depth += 1
            elif char == "]":
                depth -= 1
            elif char == ";" and depth == 0:
                break
            elif char == "{":
                end = closing_brace(text, end)
                break
        at = end
    kept.append(text[at:])
    return "".join(kept)


def closing_brace(text, after_open):
    """The index after the `}` that closes the `{` just before `after_open`."""
    depth, at = 1, after_open
    while at < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[at], 0)
        at += 1
    return at


def modules(src):
    """Each module's path (a tuple of names) and its file."""
    found = {}
    for file in src.rglob("*.rs"):
        parts = list(file.relative_to(src).with_suffix("").parts)
        if parts[-1] in ROOT_FILES:
            parts.pop()
        found[tuple(parts)] = file
    return found


def reexports(root_text, found):
    """Names the crate root re-exports, mapped to the module of this crate
    they come from (the longest prefix of the `pub use` path that is one),
    or to None when they come from another crate (a path through them is
    no edge)."""
    names = {}
    for group_path, group, single_path, single in REEXPORT.findall(root_text):
        path = (group_path or single_path).split("::")
        if path[0] == "crate":
            continue
        module = next((tuple(path[:end]) for end in range(len(path), 0, -1) if tuple(path[:end]) in found), None)
        for name in (group.split(",") if group else [single]):
            name = name.strip().split(" as ")[-1].strip()
            if name:
                names[name] = module
    return names


def resolve(found, names, path):
    """The module a path names: its longest prefix that is a module."""
    if path and path[0] in names and (path[0],) not in found:
        if names[path[0]] is None:
            return None
        path = list(names[path[0]]) + path[1:]
    for end in range(len(path), -1, -1):
        if tuple(path[:end]) in found:
            return tuple(path[:end])
    return None


def dependencies(src):
    found = modules(src)
    root = found[()].read_text()
    names = reexports(root, found)
    edges = defaultdict(set)
    for module, file in found.items():
        text = without_test_items(COMMENT.sub("", file.read_text()))
        is_dir = file.stem in ROOT_FILES
        parent = list(module) if is_dir else list(module[:-1])
        def base(anchor):
            return [] if anchor == "crate" else parent[:-1] if is_dir else parent
        paths = [base(a) + rest.strip(":").split("::") for a, rest in PATH.findall(text)]
        for anchor, prefix, items in GROUP.findall(text):
            head = base(anchor) + [s for s in prefix.strip(":").split("::") if s]
            for item in items.split(","):
                segments = [s for s in item.strip().split(" as ")[0].split("::") if s and s != "self"]
                paths.append(head + segments)
        for path in paths:
            target = resolve(found, names, path)
            if target is not None and target != module:
                edges[module].add(target)
    return found, edges


def components(nodes, edges):
    """Tarjan's strongly connected components, iteratively."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    out.append(component)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return out


def main():
    root = Path(__file__).resolve().parent.parent
    args = sys.argv[1:]
    limit = None
    if args[:1] == ["--max"]:
        limit, args = int(args[1]), args[2:]
    crates = args or tomllib.loads((root / "Cargo.toml").read_text())["workspace"]["members"]
    over = []
    for crate in crates:
        src = root / crate / "src"
        # A package of examples only (the quickstart) has no modules.
        if not src.is_dir():
            continue
        found, edges = dependencies(src)
        largest = max(components(list(found), edges), key=len)
        files = ", ".join(sorted("::".join(m) or "(root)" for m in largest)) if len(largest) > 1 else ""
        print(f"{crate}: {len(found)} files, largest cycle {len(largest)}" + (f": {files}" if files else ""))
        if limit is not None and len(largest) > limit:
            over.append(crate)
    if over:
        print(f"import cycles of more than {limit} files in: {', '.join(over)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
