#!/usr/bin/env python3
"""Import cycles between the files of each crate of the workspace.

    scripts/check-imports.py [--workspace DIR] [--graph] [--only PACKAGE]... [--skip PACKAGE]...

Draws, for every target of every workspace member (`cargo metadata --no-deps`), a graph
whose nodes are the target's source files: a `mod.rs` and each of its children are
separate files. An edge runs from a file to the file that defines a module it names:

- a `use` item (`use crate::a::b::C;`, `use super::x;`, `use self::y::{z, w};`, and
  `use child::Item;` where `child` is a module declared in the same module);
- a `crate::`, `$crate::`, `super::` or `self::` path anywhere in the code.

A path is resolved through the module tree as far as it names modules; the edge goes to
the file that defines the last module it reaches (`crate::ledger::Ledger` -> the file of
`ledger`). `mod` declarations are not edges, and code under `#[cfg(test)]` (or any
`cfg` that requires `test`) is left out, with the files it declares. Comments and string
literals are ignored.

Fails (exit 1) when a cycle passes through more than one file, naming each cycle, the
files on it, and the line that makes each edge. Exit 2: the workspace could not be read.
Python 3 standard library only.
"""

import argparse
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field

IDENT = r"(?:r#)?[A-Za-z_][A-Za-z0-9_]*"


# ---------------------------------------------------------------------------------------
# Reading a Rust file: comments and literals blanked, test code cut out.


def blank(text, start, end):
    """`text` with [start, end) replaced by spaces, newlines kept (line numbers hold)."""
    middle = "".join("\n" if c == "\n" else " " for c in text[start:end])
    return text[:start] + middle + text[end:]


def strip_comments_and_literals(src):
    """The source with every comment and the inside of every string and character literal
    replaced by spaces. Quotes stay, so `#[path = "x.rs"]` can be read back from `src` at
    the same offsets."""
    out = list(src)
    n = len(src)
    i = 0

    def wipe(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    def ident_char(k):
        return 0 <= k < n and (src[k].isalnum() or src[k] == "_")

    while i < n:
        c = src[i]
        if c == "/" and i + 1 < n and src[i + 1] == "/":
            j = src.find("\n", i)
            j = n if j < 0 else j
            wipe(i, j)
            i = j
        elif c == "/" and i + 1 < n and src[i + 1] == "*":
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            wipe(i, j)
            i = j
        elif c in "rbc" and not ident_char(i - 1):
            # Raw strings: r"..", r#".."#, br#".."#, cr".."; byte and C strings: b"..", c"..".
            m = re.match(r'(?:br|cr|r)(#*)"', src[i:])
            if m:
                hashes = m.group(1)
                body = i + m.end()
                close = src.find('"' + hashes, body)
                close = n if close < 0 else close
                wipe(body, close)
                i = close + 1 + len(hashes)
            elif src.startswith(('b"', 'c"'), i):
                i = skip_string(src, i + 1, wipe)
            elif src.startswith("b'", i):
                i = skip_char(src, i + 1, wipe)
            else:
                i += 1
        elif c == '"':
            i = skip_string(src, i, wipe)
        elif c == "'":
            i = skip_char(src, i, wipe)
        else:
            i += 1
    return "".join(out)


def skip_string(src, i, wipe):
    """`src[i]` is the opening quote; returns the offset after the closing one."""
    j = i + 1
    while j < len(src) and src[j] != '"':
        j += 2 if src[j] == "\\" else 1
    wipe(i + 1, min(j, len(src)))
    return j + 1


def skip_char(src, i, wipe):
    """`src[i]` is a quote: a character literal (blanked) or a lifetime (left alone)."""
    if i + 1 < len(src) and src[i + 1] == "\\":
        j = i + 2
        while j < len(src) and src[j] != "'":
            j += 1
        wipe(i + 1, j)
        return j + 1
    if i + 2 < len(src) and src[i + 2] == "'":
        wipe(i + 1, i + 2)
        return i + 3
    return i + 1


def matching(text, open_at):
    """Offset of the bracket that closes the one at `open_at`, or len(text)."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    stack = [pairs[text[open_at]]]
    j = open_at + 1
    while j < len(text) and stack:
        c = text[j]
        if c in pairs:
            stack.append(pairs[c])
        elif c in ")]}":
            stack.pop()
        j += 1
    return j - 1


def item_end(text, start):
    """Offset just after the item that starts at `start` (after its attributes): its first
    `;` outside brackets, or the `}` that closes its first top-level brace."""
    depth = 0
    j = start
    while j < len(text):
        c = text[j]
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif c == "{":
            if depth == 0:
                return matching(text, j) + 1
            depth += 1
        elif c == "}":
            if depth == 0:  # end of the enclosing block: the item was the last thing in it
                return j
            depth -= 1
        elif c == ";" and depth == 0:
            return j + 1
        j += 1
    return len(text)


def cfg_requires_test(predicate):
    """Whether the cfg predicate (the text inside `cfg(...)`) can only hold under `test`."""
    predicate = predicate.strip()
    if predicate == "test":
        return True
    m = re.fullmatch(r"(all|any|not)\s*\((.*)\)", predicate, re.S)
    if not m:
        return False
    parts = split_top(m.group(2), ",")
    parts = [p for p in parts if p.strip()]
    if m.group(1) == "all":
        return any(cfg_requires_test(p) for p in parts)
    if m.group(1) == "any":
        return bool(parts) and all(cfg_requires_test(p) for p in parts)
    return False


def split_top(text, sep):
    """`text` split on `sep` outside brackets."""
    parts, depth, last = [], 0, 0
    for j, c in enumerate(text):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == sep and depth == 0:
            parts.append(text[last:j])
            last = j + 1
    parts.append(text[last:])
    return parts


def skip_attributes(text, j):
    """Offset of the first thing after the outer attributes that start at or after `j`."""
    while True:
        while j < len(text) and text[j].isspace():
            j += 1
        if text.startswith("#[", j):
            j = matching(text, j + 1) + 1
        else:
            return j


TEST_ONLY_FILE = re.compile(r"#!\[\s*cfg\s*\(")


def cut_test_code(clean):
    """Blank every item under a cfg that requires `test`. Returns (text, whole_file_is_test)."""
    # An inner attribute #![cfg(test)] makes the whole file test code.
    for m in TEST_ONLY_FILE.finditer(clean):
        close = matching(clean, m.end() - 1)
        if cfg_requires_test(clean[m.end() : close]):
            return blank(clean, 0, len(clean)), True
    pos = 0
    pattern = re.compile(r"#\[\s*cfg\s*\(")
    while True:
        m = pattern.search(clean, pos)
        if not m:
            return clean, False
        close = matching(clean, m.end() - 1)
        attr_end = matching(clean, m.start() + 1) + 1
        if cfg_requires_test(clean[m.end() : close]):
            end = item_end(clean, skip_attributes(clean, attr_end))
            clean = blank(clean, m.start(), end)
            pos = end
        else:
            pos = attr_end


# ---------------------------------------------------------------------------------------
# The module tree.


@dataclass
class Module:
    name: str
    file: str
    parent: "Module | None"
    # Where inline modules' children live, and whether `mod x;` is relative to it (mod-rs).
    child_dir: str
    children: dict = field(default_factory=dict)
    # For an inline module: its span in the file's text.
    span: tuple = None


@dataclass
class Source:
    path: str
    text: str  # the original
    clean: str  # comments, literals and test code blanked
    module: Module
    inline: list = field(default_factory=list)  # (start, end, Module), outermost first


MOD_DECL = re.compile(r"(?<![\w$])mod\s+(" + IDENT + r")\s*([;{])")


def preceding_path_attribute(source_text, clean, at):
    """The value of a `#[path = "..."]` among the attributes right before offset `at`."""
    j = at
    # Step back over a visibility (`pub`, `pub(crate)`, `pub(in a::b)`) and `unsafe`.
    head = clean[:j]
    m = re.search(r"(?:pub\s*(?:\([^)]*\))?\s*)?(?:unsafe\s+)?$", head)
    j = m.start() if m else j
    while True:
        k = j - 1
        while k >= 0 and clean[k].isspace():
            k -= 1
        if k < 0 or clean[k] != "]":
            return None
        # Find the `#[` that opens this attribute.
        depth, s = 0, k
        while s >= 0:
            if clean[s] == "]":
                depth += 1
            elif clean[s] == "[":
                depth -= 1
                if depth == 0:
                    break
            s -= 1
        if s <= 0 or clean[s - 1] != "#":
            return None
        attr = clean[s - 1 : k + 1]
        pm = re.match(r'#\[\s*path\s*=\s*"', attr)
        if pm:
            q = s - 1 + pm.end()
            end = source_text.index('"', q)
            return source_text[q:end]
        j = s - 1


class Crate:
    """One target: its files, its module tree and the edges between its files."""

    def __init__(self, name, root):
        self.name = name
        self.root_file = os.path.normpath(root)
        self.sources = {}  # path -> Source
        self.missing = []  # (declaring file, line, module): a `mod x;` whose file is not there
        self.root = Module("crate", self.root_file, None, os.path.dirname(self.root_file))
        self.load(self.root, mod_rs=True)
        self.edges = {}  # (from, to) -> [(line, text)]
        for source in self.sources.values():
            self.find_edges(source)

    # Files and modules.

    def load(self, module, mod_rs):
        path = module.file
        with open(path, encoding="utf-8") as f:
            text = f.read()
        clean, _ = cut_test_code(strip_comments_and_literals(text))
        source = Source(path, text, clean, module)
        self.sources[path] = source
        directory = os.path.dirname(path)
        if mod_rs:
            children_dir = directory
        else:
            children_dir = os.path.join(directory, os.path.splitext(os.path.basename(path))[0])
        module.child_dir = children_dir
        self.declare(source, module, 0, len(clean), children_dir)

    def declare(self, source, module, start, end, children_dir):
        """The `mod` declarations of `module`, found in source.clean[start:end]. A child
        `mod x;` is x.rs or x/mod.rs in `children_dir`; with `#[path = "p"]` it is p,
        relative to the file's directory (to `children_dir` inside an inline module)."""
        clean = source.clean
        pos = start
        while True:
            m = MOD_DECL.search(clean, pos, end)
            if not m:
                return
            name = m.group(1).removeprefix("r#")
            explicit = preceding_path_attribute(source.text, clean, m.start())
            relative_to = children_dir if module.span else os.path.dirname(source.path)
            if m.group(2) == "{":
                close = matching(clean, m.end() - 1)
                inner_dir = os.path.join(children_dir, name) if explicit is None else os.path.join(relative_to, explicit)
                child = Module(name, source.path, module, os.path.normpath(inner_dir), span=(m.end(), close))
                module.children[name] = child
                source.inline.append((m.end(), close, child))
                self.declare(source, child, m.end(), close, child.child_dir)
                pos = close + 1
                continue
            pos = m.end()
            if explicit is not None:
                candidates = [os.path.join(relative_to, explicit)]
            else:
                candidates = [os.path.join(children_dir, name + ".rs"), os.path.join(children_dir, name, "mod.rs")]
            found = next((os.path.normpath(c) for c in candidates if os.path.isfile(c)), None)
            if found is None:
                line = clean.count("\n", 0, m.start()) + 1
                self.missing.append((source.path, line, name))
                continue
            if found in self.sources:  # the same file twice (only through #[path]): one node
                module.children[name] = self.sources[found].module
                continue
            child = Module(name, found, module, "")
            module.children[name] = child
            # A file loaded through #[path] keeps its children beside it, as a mod.rs does.
            self.load(child, mod_rs=explicit is not None or os.path.basename(found) == "mod.rs")

    def module_at(self, source, offset):
        """The innermost module whose code is at `offset` of the file."""
        module = source.module
        for start, end, child in source.inline:
            if start <= offset < end:
                module = child  # later entries are nested deeper or elsewhere
        return module

    # Edges.

    def resolve(self, module, segments):
        """The file defining the last module that `segments` reaches from `module`, or None
        when the path does not start in this crate."""
        if not segments:
            return None
        first = segments[0]
        rest = segments[1:]
        if first in ("crate", "$crate"):
            current = self.root
        elif first == "self":
            current = module
        elif first == "super":
            current = module.parent or module
            while rest and rest[0] == "super":
                current = current.parent or current
                rest = rest[1:]
        elif first in module.children:
            current = module.children[first]
        else:
            return None  # another crate, or an item in scope
        for segment in rest:
            nxt = current.children.get(segment)
            if nxt is None:
                break
            current = nxt
        return current.file

    def add_edge(self, source, offset, target, text):
        if target is None or target == source.path:
            return
        line = source.clean.count("\n", 0, offset) + 1
        self.edges.setdefault((source.path, target), []).append((line, " ".join(text.split())))

    def find_edges(self, source):
        clean = source.clean
        # `use` items first; then blank them so their paths are not read twice.
        for m in re.finditer(r"(?<![\w$])use\s", clean):
            end = item_end(clean, m.end())
            tree = clean[m.end() : end].rstrip().rstrip(";")
            module = self.module_at(source, m.start())
            for segments in expand_use(tree):
                self.add_edge(source, m.start(), self.resolve(module, segments), "use " + "::".join(segments))
        clean = re.sub(r"(?<![\w$])use\s[^;]*;", lambda u: blank(u.group(0), 0, len(u.group(0))), clean)
        path = re.compile(r"(?<![\w:])(\$crate|crate|super|self)((?:\s*::\s*" + IDENT + r")+)")
        for m in path.finditer(clean):
            if re.search(r"\bin\s*$", clean[max(0, m.start() - 8) : m.start()]):
                continue  # pub(in crate::a): a visibility, not a use
            segments = [m.group(1)] + [s.strip() for s in m.group(2).split("::") if s.strip()]
            module = self.module_at(source, m.start())
            self.add_edge(source, m.start(), self.resolve(module, segments), "::".join(segments))

    # Cycles.

    def cycles(self):
        """Strongly connected components of more than one file, each with one cycle through
        it: [(files, [(from, to, [(line, text)])])]."""
        graph = {}
        for (a, b) in self.edges:
            graph.setdefault(a, set()).add(b)
        out = []
        for component in strongly_connected(graph):
            if len(component) < 2:
                continue
            members = set(component)
            start = min(members)
            path = shortest_cycle(graph, start, members)
            steps = [(a, b, self.edges[(a, b)]) for a, b in zip(path, path[1:])]
            out.append((sorted(members), steps))
        return out


def expand_use(tree):
    """The full paths of a use tree: `crate::{a::{b, c as d}, e::*}` ->
    [[crate, a, b], [crate, a, c], [crate, e]]."""
    tree = " ".join(tree.split())
    if tree.startswith("::"):
        return []
    brace = tree.find("{")
    if brace < 0:
        tree = re.sub(r"\s+as\s+\S+$", "", tree)
        segments = [s.strip() for s in tree.split("::") if s.strip()]
        return [segments] if segments else []
    head = [s.strip() for s in tree[:brace].split("::") if s.strip()]
    inner = tree[brace + 1 : matching(tree, brace)]
    paths = []
    for part in split_top(inner, ","):
        if not part.strip():
            continue
        paths.extend(head + s for s in expand_use(part))
    if not paths and head:
        paths.append(head)
    return paths


def strongly_connected(graph):
    """Tarjan's algorithm, iterative."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]
    nodes = set(graph) | {b for bs in graph.values() for b in bs}
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == node:
                        break
                out.append(component)
    return out


def shortest_cycle(graph, start, members):
    """The shortest path start -> ... -> start inside `members` (breadth first)."""
    previous = {}
    frontier = [start]
    seen = set()
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph.get(node, ())):
                if nxt not in members:
                    continue
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start] + path[::-1][1:] + [start] if node != start else [start, start]
                if nxt not in seen:
                    seen.add(nxt)
                    previous[nxt] = node
                    following.append(nxt)
        frontier = following
    return [start]


# ---------------------------------------------------------------------------------------
# The workspace.


def workspace_targets(workspace):
    """[(package, target name, kinds, root file)] of every workspace member."""
    out = subprocess.run(
        ["cargo", "metadata", "--no-deps", "--offline", "--format-version", "1"],
        cwd=workspace,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise RuntimeError("cargo metadata failed: " + out.stderr.strip())
    meta = json.loads(out.stdout)
    members = set(meta["workspace_members"])
    targets = []
    for package in meta["packages"]:
        if package["id"] not in members:
            continue
        for target in package["targets"]:
            targets.append((package["name"], target["name"], target["kind"], target["src_path"]))
    return targets


def check(targets, base):
    """Every cycle of every target, deduplicated: ([(label, files, steps)], the `mod`
    declarations whose file is missing, the number of files read)."""
    seen, found, missing, files = set(), [], [], set()
    for package, name, kinds, root in targets:
        crate = Crate(f"{package} ({'/'.join(kinds)} {name})", root)
        files.update(crate.sources)
        missing += [(os.path.relpath(f, base), line, m) for f, line, m in crate.missing]
        for members, steps in crate.cycles():
            key = frozenset(members)
            if key in seen:
                continue
            seen.add(key)
            found.append((crate.name, members, steps))
    return found, sorted(set(missing)), len(files)


def report(found, base, out):
    rel = lambda p: os.path.relpath(p, base)  # noqa: E731
    for label, files, steps in found:
        print(f"import cycle through {len(files)} files in {label}:", file=out)
        print("  " + " -> ".join(rel(a) for a, _, _ in steps) + " -> " + rel(steps[0][0]), file=out)
        for a, b, evidence in steps:
            line, text = evidence[0]
            more = f" (and {len(evidence) - 1} more)" if len(evidence) > 1 else ""
            print(f"    {rel(a)}:{line}: {text}{more}", file=out)
        if len(files) > len(steps):
            print("  every file of the cycle: " + ", ".join(rel(f) for f in files), file=out)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Fails on an import cycle through more than one file of a crate.")
    parser.add_argument("--workspace", default=".", help="the workspace's root (default: .)")
    parser.add_argument("--only", action="append", default=[], metavar="PACKAGE", help="check only this package (repeatable)")
    parser.add_argument("--skip", action="append", default=[], metavar="PACKAGE", help="leave this package out (repeatable)")
    parser.add_argument("--graph", action="store_true", help="print every edge as FROM -> TO (line: path)")
    args = parser.parse_args(argv)
    base = os.path.abspath(args.workspace)
    try:
        targets = workspace_targets(base)
    except (RuntimeError, OSError, ValueError) as e:
        print(f"check-imports: {e}", file=sys.stderr)
        return 2
    targets = [t for t in targets if (not args.only or t[0] in args.only) and t[0] not in args.skip]
    if not targets:
        print("check-imports: no target to check", file=sys.stderr)
        return 2
    if args.graph:
        for package, name, kinds, root in targets:
            crate = Crate(package, root)
            for (a, b), evidence in sorted(crate.edges.items()):
                line, text = evidence[0]
                print(f"{package}: {os.path.relpath(a, base)} -> {os.path.relpath(b, base)} ({line}: {text})")
    found, missing, files = check(targets, base)
    for path, line, name in missing:
        print(f"check-imports: {path}:{line}: no file for `mod {name};`", file=sys.stderr)
    if missing:
        return 2
    report(found, base, sys.stdout)
    packages = sorted({t[0] for t in targets})
    if found:
        where = sorted({label.split(" ")[0] for label, _, _ in found})
        print(f"check-imports: {len(found)} import cycle(s) through more than one file, in {', '.join(where)}")
        return 1
    print(f"check-imports: no import cycle through more than one file ({len(targets)} targets of {len(packages)} packages, {files} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
