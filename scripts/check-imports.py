#!/usr/bin/env python3
"""The house rules of the workspace's imports: no cycles, layers kept, crate arrows kept.

    scripts/check-imports.py [--workspace DIR] [--rules FILE] [--graph] [--only PACKAGE]... [--skip PACKAGE]...

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

Three rules, all read from one table (`scripts/layers.toml`, or --rules FILE), which
docs/architecture.md shows (the table names the document; the check fails when the
document's copy differs):

1. No import cycle passes through more than one file of a crate.
2. Layers: for each crate the table lists, its files are placed in groups, in rows from the
   top down; a file may name a file of its own group or of a group in a lower row, never
   one in a higher row or beside it in its row. A file the table does not place fails too.
3. Crate arrows: each workspace member may depend (normal and build dependencies) only on
   the members its `deps` names, and in dev-dependencies on those and its `dev`; a member
   the table does not list fails.

Fails (exit 1) on any breach, naming the files, the line that makes each edge, or the
dependency. Exit 2: the workspace or the table could not be read. Python 3.11 standard
library only.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tomllib
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
    return read_workspace(workspace)[0]


def read_workspace(workspace):
    """(targets as workspace_targets gives them, {package: {(member it depends on, kind)}}),
    kind being `normal`, `build` or `dev`."""
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
    packages = [p for p in meta["packages"] if p["id"] in members]
    names = {p["name"] for p in packages}
    targets, deps = [], {}
    for package in packages:
        for target in package["targets"]:
            targets.append((package["name"], target["name"], target["kind"], target["src_path"]))
        deps[package["name"]] = {(d["name"], d["kind"] or "normal") for d in package["dependencies"] if d["name"] in names}
    return targets, deps


# ---------------------------------------------------------------------------------------
# The table: layers inside crates, and arrows between them.


def load_rules(path):
    """The table (scripts/layers.toml): {"doc": path or None, "crates": {...}, "layers": {...}}."""
    with open(path, "rb") as f:
        rules = tomllib.load(f)
    crates = rules.get("crates", {})
    for name, allowed in crates.items():
        unknown = set(allowed) - {"deps", "dev"}
        if unknown:
            raise ValueError(f"{path}: crates.{name}: unknown key(s) {sorted(unknown)} (deps, dev)")
    for name, layer in rules.get("layers", {}).items():
        rows = layer.get("rows")
        if not isinstance(rows, list) or not all(isinstance(r, list) and r for r in rows):
            raise ValueError(f"{path}: layers.{name}: `rows` must be a list of non-empty lists of paths")
        if "src" not in layer:
            raise ValueError(f"{path}: layers.{name}: `src` (the crate's source folder) is missing")
    return {"doc": rules.get("doc"), "crates": crates, "layers": rules.get("layers", {})}


def crate_arrows(deps, rules):
    """Every dependency between members the table does not allow: [(package, dependency,
    kind, why)]."""
    out = []
    crates = rules["crates"]
    for package in sorted(deps):
        if package not in crates:
            out.append((package, None, None, "the member is not in the table's [crates]"))
            continue
        allowed = set(crates[package].get("deps", []))
        dev = allowed | set(crates[package].get("dev", []))
        for dep, kind in sorted(deps[package]):
            if dep not in (dev if kind == "dev" else allowed):
                out.append((package, dep, kind, f"{package} may depend on {', '.join(sorted(allowed)) or 'no member'}" + (f" (dev: {', '.join(sorted(dev - allowed))})" if dev - allowed else "")))
    return out


class Layers:
    """The rows of one crate: which group each source file is in, and whether an edge
    between two files is allowed."""

    def __init__(self, base, layer):
        self.src = os.path.normpath(os.path.join(base, layer["src"]))
        self.groups = []  # (row, name)
        for row, names in enumerate(layer["rows"]):
            for name in names:
                self.groups.append((row, name))

    def group_of(self, path):
        """(row, group) of a file, or None when the table places it nowhere."""
        rel = os.path.relpath(os.path.normpath(path), self.src)
        if rel.startswith(".."):
            return None
        for row, name in self.groups:
            stem = name[:-3] if name.endswith(".rs") else name
            if rel == name or rel == stem + ".rs" or rel.startswith(stem + os.sep):
                return row, name
        return None

    def breaches(self, crate):
        """([(from, to, from group, to group, evidence)], [unplaced files]) of a target."""
        unplaced = sorted(p for p in crate.sources if self.group_of(p) is None)
        out = []
        for (a, b), evidence in sorted(crate.edges.items()):
            ga, gb = self.group_of(a), self.group_of(b)
            if ga is None or gb is None or ga[1] == gb[1]:
                continue
            if gb[0] <= ga[0]:
                out.append((a, b, ga, gb, evidence))
        return out, unplaced


DOC_MARK = "<!-- scripts/layers.toml -->"


def doc_differs(base, rules_path, doc):
    """Why the document's copy of the table is not the table, or None when it is. The copy
    is the fenced block right after the line `<!-- scripts/layers.toml -->`."""
    path = os.path.join(base, doc)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        with open(rules_path, encoding="utf-8") as f:
            table = f.read()
    except OSError as e:
        return f"cannot read it: {e}"
    at = text.find(DOC_MARK)
    if at < 0:
        return f"it has no line {DOC_MARK} followed by a copy of the table"
    m = re.match(r"\s*```[a-z]*\n(.*?)```", text[at + len(DOC_MARK) :], re.S)
    if not m:
        return f"no fenced block follows {DOC_MARK}"
    if m.group(1).strip() != table.strip():
        return "its copy of the table differs from the table: copy the table into it again"
    return None


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


def report_layers(breaches, unplaced, base, out):
    rel = lambda p: os.path.relpath(p, base)  # noqa: E731
    for label, a, b, ga, gb, evidence in breaches:
        line, text = evidence[0]
        where = "above it" if gb[0] < ga[0] else "beside it"
        print(f"layer crossed in {label}: {rel(a)} ({ga[1]}) names {rel(b)} ({gb[1]}, {where})", file=out)
        print(f"    {rel(a)}:{line}: {text}" + (f" (and {len(evidence) - 1} more)" if len(evidence) > 1 else ""), file=out)
    for label, path in unplaced:
        print(f"file placed in no layer of {label}: {rel(path)} (add it to a row of the table)", file=out)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Fails on an import cycle through more than one file of a crate, a layer crossed, or a crate arrow the table does not allow.")
    parser.add_argument("--workspace", default=".", help="the workspace's root (default: .)")
    parser.add_argument("--rules", metavar="FILE", help="the table of layers and crate arrows (default: scripts/layers.toml under the workspace)")
    parser.add_argument("--only", action="append", default=[], metavar="PACKAGE", help="check only this package (repeatable)")
    parser.add_argument("--skip", action="append", default=[], metavar="PACKAGE", help="leave this package out (repeatable)")
    parser.add_argument("--graph", action="store_true", help="print every edge as FROM -> TO (line: path)")
    args = parser.parse_args(argv)
    base = os.path.abspath(args.workspace)
    rules_path = args.rules or os.path.join(base, "scripts", "layers.toml")
    try:
        targets, deps = read_workspace(base)
        rules = load_rules(rules_path)
    except (RuntimeError, OSError, ValueError, tomllib.TOMLDecodeError) as e:
        print(f"check-imports: {e}", file=sys.stderr)
        return 2
    targets = [t for t in targets if (not args.only or t[0] in args.only) and t[0] not in args.skip]
    deps = {p: d for p, d in deps.items() if (not args.only or p in args.only) and p not in args.skip}
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

    # Layers.
    breaches, unplaced, layered = [], [], set()
    for package, name, kinds, root in targets:
        layer = rules["layers"].get(package)
        if layer is None:
            continue
        layers = Layers(base, layer)
        if layers.group_of(root) is None:
            continue  # a target outside the crate's source folder (a test, a bench)
        crate = Crate(f"{package} ({'/'.join(kinds)} {name})", root)
        b, u = layers.breaches(crate)
        breaches += [(crate.name, *x) for x in b]
        unplaced += [(crate.name, p) for p in u]
        layered.add(package)
    for package in sorted(set(rules["layers"]) - {t[0] for t in targets}):
        if not args.only and package not in args.skip:
            unplaced.append((package, os.path.join(base, "scripts", "layers.toml")))
            print(f"check-imports: the table has layers for {package}, which is not a member", file=sys.stderr)
    report_layers(breaches, unplaced, base, sys.stdout)

    # Crate arrows.
    arrows = crate_arrows(deps, rules)
    for package, dep, kind, why in arrows:
        if dep is None:
            print(f"crate arrow: {package}: {why}")
        else:
            print(f"crate arrow not allowed: {package} -> {dep} ({kind} dependency); {why}")

    # The document's copy of the table.
    doc = None
    if rules["doc"] and not args.only and not args.skip:
        doc = doc_differs(base, rules_path, rules["doc"])
        if doc:
            print(f"check-imports: {rules['doc']}: {doc}")

    packages = sorted({t[0] for t in targets})
    failures = []
    if found:
        where = sorted({label.split(" ")[0] for label, _, _ in found})
        failures.append(f"{len(found)} import cycle(s) through more than one file, in {', '.join(where)}")
    if breaches or unplaced:
        failures.append(f"{len(breaches)} layer(s) crossed and {len(unplaced)} file(s) placed in no layer")
    if arrows:
        failures.append(f"{len(arrows)} crate arrow(s) the table does not allow")
    if doc:
        failures.append(f"{rules['doc']} does not show the table")
    if failures:
        print("check-imports: " + "; ".join(failures))
        return 1
    print(
        f"check-imports: no import cycle through more than one file ({len(targets)} targets of {len(packages)} packages, {files} files); "
        f"the layers of {', '.join(sorted(layered)) or 'no crate'} kept; every crate arrow allowed ({sum(len(d) for d in deps.values())} dependencies between members)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
