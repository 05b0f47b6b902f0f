#!/usr/bin/env python3
"""Build docker-bake.hcl targets with plain `docker build`, for engines without buildx.

Debian's and Ubuntu's `docker.io` packages ship no buildx, so `docker buildx bake` is not
there. This reads the same bake file (the subset of HCL that images/docker-bake.hcl uses:
variable, group and target blocks; strings with "${...}" interpolation of variables and
matrix values; lists, objects, matrix) and runs one `docker build` per target with the
same context, Dockerfile, build arguments and tags that bake would use. Variables are
overridden from the environment, as with bake.

    python3 images/bake.py -f images/docker-bake.hcl --print            # like bake --print
    python3 images/bake.py -f images/docker-bake.hcl u22-cu12-3-8gb     # build one target
    python3 images/bake.py -f images/docker-bake.hcl --dry-run          # show the commands
    SIZE=10 python3 images/bake.py -f images/docker-bake.hcl custom

Standard library only (Python 3.6+).
"""

import argparse
import itertools
import json
import os
import re
import shlex
import subprocess
import sys


class BakeError(Exception):
    pass


# ---------------------------------------------------------------- lexer

TOKEN_RE = re.compile(
    r"""
    (?P<ws>[ \t\r\n]+)
  | (?P<comment>\#[^\n]*|//[^\n]*|/\*.*?\*/)
  | (?P<string>")
  | (?P<number>-?[0-9]+(?:\.[0-9]+)?)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_-]*)
  | (?P<punct>[{}\[\]=,.:()])
    """,
    re.VERBOSE | re.DOTALL,
)


def lex(text):
    """Yields (kind, value, offset). A string token's value is a list of parts: str for
    literal text, list-of-tokens for an interpolation."""
    pos = 0
    out = []
    while pos < len(text):
        m = TOKEN_RE.match(text, pos)
        if not m:
            raise BakeError("cannot parse at %r" % text[pos:pos + 30])
        kind = m.lastgroup
        if kind in ("ws", "comment"):
            pos = m.end()
            continue
        if kind == "string":
            parts, pos = lex_string(text, m.end())
            out.append(("string", parts, m.start()))
            continue
        out.append((kind, m.group(kind), m.start()))
        pos = m.end()
    out.append(("eof", None, pos))
    return out


def lex_string(text, pos):
    parts = []
    buf = []
    while True:
        if pos >= len(text):
            raise BakeError("unterminated string")
        c = text[pos]
        if c == '"':
            if buf:
                parts.append("".join(buf))
            return parts, pos + 1
        if c == "\\":
            nxt = text[pos + 1]
            buf.append({"n": "\n", "t": "\t", '"': '"', "\\": "\\"}.get(nxt, "\\" + nxt))
            pos += 2
            continue
        if text.startswith("$${", pos):
            buf.append("${")
            pos += 3
            continue
        if text.startswith("${", pos):
            end = find_interp_end(text, pos + 2)
            if buf:
                parts.append("".join(buf))
                buf = []
            inner = lex(text[pos + 2:end])
            parts.append(inner)
            pos = end + 1
            continue
        buf.append(c)
        pos += 1


def find_interp_end(text, pos):
    depth = 0
    in_str = False
    while pos < len(text):
        c = text[pos]
        if in_str:
            if c == "\\":
                pos += 2
                continue
            if c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c == "{":
            depth += 1
        elif c == "}":
            if depth == 0:
                return pos
            depth -= 1
        pos += 1
    raise BakeError("unterminated interpolation")


# ---------------------------------------------------------------- parser
# Expressions become tuples: ("lit", value), ("tmpl", [parts]), ("ref", [names]),
# ("list", [exprs]), ("obj", [(key, expr)]).


class Parser:
    def __init__(self, tokens):
        self.toks = tokens
        self.i = 0

    def peek(self, k=0):
        return self.toks[self.i + k]

    def take(self, kind=None, value=None):
        tok = self.toks[self.i]
        if kind and tok[0] != kind or value is not None and tok[1] != value:
            raise BakeError("expected %s %s, found %r" % (kind, value or "", tok[1]))
        self.i += 1
        return tok

    def body(self, closing=None):
        attrs, blocks = {}, []
        while True:
            tok = self.peek()
            if closing and tok[0] == "punct" and tok[1] == closing:
                self.take()
                return attrs, blocks
            if tok[0] == "eof":
                if closing:
                    raise BakeError("missing %s" % closing)
                return attrs, blocks
            name = self.take("ident")[1]
            if self.peek()[1] == "=":
                self.take()
                attrs[name] = self.expr()
                continue
            labels = []
            while self.peek()[0] == "string":
                labels.append(literal_string(self.take()[1]))
            self.take("punct", "{")
            battrs, bblocks = self.body("}")
            blocks.append((name, labels, battrs, bblocks))

    def expr(self):
        tok = self.take()
        kind, val = tok[0], tok[1]
        if kind == "string":
            return ("tmpl", [p if isinstance(p, str) else Parser(p).whole() for p in val])
        if kind == "number":
            return ("lit", float(val) if "." in val else int(val))
        if kind == "ident":
            if val in ("true", "false"):
                return ("lit", val == "true")
            if val == "null":
                return ("lit", None)
            if self.peek()[1] == "(":
                raise BakeError("function %s(): bake.py supports no function calls" % val)
            names = [val]
            while self.peek()[1] == ".":
                self.take()
                names.append(self.take("ident")[1])
            return ("ref", names)
        if val == "[":
            items = []
            while self.peek()[1] != "]":
                items.append(self.expr())
                if self.peek()[1] == ",":
                    self.take()
            self.take()
            return ("list", items)
        if val == "{":
            items = []
            while self.peek()[1] != "}":
                ktok = self.take()
                key = literal_string(ktok[1]) if ktok[0] == "string" else ktok[1]
                if self.take()[1] not in ("=", ":"):
                    raise BakeError("expected = after %s" % key)
                items.append((key, self.expr()))
                if self.peek()[1] == ",":
                    self.take()
            self.take()
            return ("obj", items)
        raise BakeError("unexpected %r" % val)

    def whole(self):
        e = self.expr()
        if self.peek()[0] != "eof":
            raise BakeError("unsupported expression near %r" % (self.peek()[1],))
        return e


def literal_string(parts):
    if any(not isinstance(p, str) for p in parts):
        raise BakeError("a label cannot hold an interpolation")
    return "".join(parts)


# ---------------------------------------------------------------- evaluation


class Bake:
    def __init__(self, text, environ):
        attrs, blocks = Parser(lex(text)).body()
        if attrs:
            raise BakeError("top-level attributes are not supported: %s" % ", ".join(attrs))
        self.environ = environ
        self.var_exprs = {}
        self.groups = {}
        self.targets = {}
        for kind, labels, battrs, _ in blocks:
            label = labels[0] if labels else None
            if kind == "variable":
                self.var_exprs[label] = battrs.get("default", ("lit", ""))
            elif kind == "group":
                self.groups[label] = battrs
            elif kind == "target":
                self.targets[label] = battrs
            else:
                raise BakeError("unsupported block %s" % kind)
        self.var_values = {}

    def var(self, name, stack=()):
        if name in self.var_values:
            return self.var_values[name]
        if name not in self.var_exprs:
            raise BakeError("unknown variable %s" % name)
        if name in stack:
            raise BakeError("variable cycle through %s" % name)
        default = self.eval(self.var_exprs[name], {}, stack + (name,))
        if name in self.environ:
            raw = self.environ[name]
            if isinstance(default, (list, dict)):
                try:
                    value = json.loads(raw)
                except ValueError:
                    value = [v.strip() for v in raw.split(",") if v.strip()]
            else:
                value = raw
        else:
            value = default
        self.var_values[name] = value
        return value

    def eval(self, e, scope, stack=()):
        kind = e[0]
        if kind == "lit":
            return e[1]
        if kind == "list":
            return [self.eval(x, scope, stack) for x in e[1]]
        if kind == "obj":
            return {k: self.eval(v, scope, stack) for k, v in e[1]}
        if kind == "ref":
            head, rest = e[1][0], e[1][1:]
            value = scope[head] if head in scope else self.var(head, stack)
            for name in rest:
                if not isinstance(value, dict) or name not in value:
                    raise BakeError("no attribute %s in %s" % (name, ".".join(e[1])))
                value = value[name]
            return value
        if kind == "tmpl":
            parts = e[1]
            if len(parts) == 1 and not isinstance(parts[0], str):
                return self.eval(parts[0], scope, stack)
            out = []
            for p in parts:
                v = p if isinstance(p, str) else self.eval(p, scope, stack)
                if isinstance(v, bool):
                    v = "true" if v else "false"
                elif isinstance(v, (list, dict)) or v is None:
                    raise BakeError("cannot interpolate %r into a string" % (v,))
                out.append(str(v))
            return "".join(out)
        raise BakeError("bad expression %r" % (e,))

    def expand(self):
        """All targets, matrices expanded: {name: definition}; and {target: [names]}."""
        resolved, generated = {}, {}
        for label, attrs in self.targets.items():
            if "matrix" in attrs:
                matrix = self.eval(attrs["matrix"], {})
                keys = list(matrix)
                names = []
                for combo in itertools.product(*(matrix[k] for k in keys)):
                    scope = dict(zip(keys, combo))
                    if "name" not in attrs:
                        raise BakeError("matrix target %s needs a name" % label)
                    name = self.eval(attrs["name"], scope)
                    if not re.match(r"^[A-Za-z0-9_-]+$", name):
                        raise BakeError("invalid target name %r" % name)
                    if name in resolved:
                        raise BakeError("duplicate target name %s" % name)
                    resolved[name] = self.definition(attrs, scope)
                    names.append(name)
                generated[label] = names
            else:
                resolved[label] = self.definition(attrs, {})
        return resolved, generated

    def definition(self, attrs, scope):
        out = {}
        for key, expr in attrs.items():
            if key in ("name", "matrix"):
                continue
            value = self.eval(expr, scope)
            if key == "args":
                value = {k: str(v) for k, v in value.items() if v is not None}
            out[key] = value
        out.setdefault("context", ".")
        out.setdefault("dockerfile", "Dockerfile")
        return out

    def group_members(self):
        return {name: self.eval(attrs.get("targets", ("list", [])), {})
                for name, attrs in self.groups.items()}


def resolve(bake, wanted):
    targets, generated = bake.expand()
    groups = bake.group_members()
    order = []

    def add(name, seen=()):
        if name in seen:
            raise BakeError("group cycle through %s" % name)
        if name in targets:
            if name not in order:
                order.append(name)
        elif name in generated:
            for n in generated[name]:
                add(n, seen)
        elif name in groups:
            for n in groups[name]:
                add(n, seen + (name,))
        else:
            raise BakeError("no target or group named %s" % name)

    for name in wanted or ["default"]:
        add(name)
    return targets, generated, groups, order


def docker_build_command(docker, definition):
    context = definition["context"]
    dockerfile = definition["dockerfile"]
    if not os.path.isabs(dockerfile):
        dockerfile = os.path.normpath(os.path.join(context, dockerfile))
    cmd = docker + ["build", "--file", dockerfile]
    for key, value in sorted(definition.get("args", {}).items()):
        cmd += ["--build-arg", "%s=%s" % (key, value)]
    for tag in definition.get("tags", []):
        cmd += ["--tag", tag]
    if definition.get("target"):
        cmd += ["--target", definition["target"]]
    for key, value in sorted(definition.get("labels", {}).items()):
        cmd += ["--label", "%s=%s" % (key, value)]
    cmd.append(context)
    return cmd


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-f", "--file", default="docker-bake.hcl")
    ap.add_argument("--print", action="store_true", help="print the resolved definition as JSON")
    ap.add_argument("--dry-run", action="store_true", help="print the docker build commands")
    ap.add_argument("--docker", default=os.environ.get("DOCKER", "docker"))
    ap.add_argument("targets", nargs="*")
    args = ap.parse_args(argv)

    try:
        with open(args.file) as fh:
            bake = Bake(fh.read(), os.environ)
        targets, generated, groups, order = resolve(bake, args.targets)
    except (BakeError, OSError) as err:
        print("bake.py: %s" % err, file=sys.stderr)
        return 2

    if args.print:
        group = dict(groups)
        group.update(generated)
        json.dump({"group": group, "target": {n: targets[n] for n in order}},
                  sys.stdout, indent=2, sort_keys=True)
        print()
        return 0

    docker = shlex.split(args.docker)
    for name in order:
        cmd = docker_build_command(docker, targets[name])
        print("bake.py: %s: %s" % (name, " ".join(shlex.quote(c) for c in cmd)), file=sys.stderr)
        if args.dry_run:
            continue
        rc = subprocess.call(cmd)
        if rc != 0:
            print("bake.py: %s failed (exit %d)" % (name, rc), file=sys.stderr)
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
