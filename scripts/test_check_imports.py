#!/usr/bin/env python3
"""Unit tests of scripts/check-imports.py on small crates written to a temp directory: import
cycles, layers crossed, crate arrows, and the document's copy of the table.

    python3 scripts/test_check_imports.py
"""

import importlib.util
import io
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("check_imports", os.path.join(HERE, "check-imports.py"))
check_imports = importlib.util.module_from_spec(spec)
sys.modules["check_imports"] = check_imports
spec.loader.exec_module(check_imports)


class Fixture(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="check-imports-")
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, files):
        for path, text in files.items():
            full = os.path.join(self.dir, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w", encoding="utf-8") as f:
                f.write(textwrap.dedent(text))

    def crate(self, files, root="src/lib.rs"):
        self.write(files)
        return check_imports.Crate("fixture", os.path.join(self.dir, root))

    def rel_cycles(self, crate):
        return [sorted(os.path.relpath(f, self.dir) for f in files) for files, _ in crate.cycles()]

    def rel_edges(self, crate):
        return sorted((os.path.relpath(a, self.dir), os.path.relpath(b, self.dir)) for a, b in crate.edges)


class Cycles(Fixture):
    def test_two_sibling_files_that_use_each_other_are_a_cycle(self):
        crate = self.crate(
            {
                "src/lib.rs": "mod a;\nmod b;\n",
                "src/a.rs": "use crate::b::B;\npub struct A;\n",
                "src/b.rs": "pub struct B;\nfn f() -> super::a::A { super::a::A }\n",
            }
        )
        self.assertEqual(self.rel_cycles(crate), [["src/a.rs", "src/b.rs"]])
        (files, steps), = crate.cycles()
        evidence = {(os.path.relpath(a, self.dir), os.path.relpath(b, self.dir)): e for a, b, e in steps}
        self.assertEqual(evidence[("src/a.rs", "src/b.rs")][0], (1, "use crate::b::B"))
        self.assertEqual(evidence[("src/b.rs", "src/a.rs")][0], (2, "super::a::A"))

    def test_a_mod_rs_and_its_child_are_separate_files(self):
        # The pattern the rule is aimed at: mod.rs re-exports from a child that imports
        # from mod.rs.
        crate = self.crate(
            {
                "src/lib.rs": "pub mod ledger;\n",
                "src/ledger/mod.rs": "mod store;\npub use store::Sharing;\npub enum LedgerError { Io }\n",
                "src/ledger/store.rs": "use super::LedgerError;\npub struct Sharing;\n",
            }
        )
        self.assertEqual(self.rel_cycles(crate), [["src/ledger/mod.rs", "src/ledger/store.rs"]])

    def test_a_cycle_through_three_files_is_named_in_order(self):
        crate = self.crate(
            {
                "src/main.rs": "mod a;\nmod b;\nmod c;\nfn main() {}\n",
                "src/a.rs": "use crate::b;\n",
                "src/b.rs": "pub fn f() { crate::c::g() }\n",
                "src/c.rs": "pub fn g() {}\nuse crate::a as _;\n",
            },
            root="src/main.rs",
        )
        (files, steps), = crate.cycles()
        order = [os.path.relpath(a, self.dir) for a, _, _ in steps]
        self.assertEqual(order, ["src/a.rs", "src/b.rs", "src/c.rs"])
        out = io.StringIO()
        check_imports.report([("fixture", files, steps)], self.dir, out)
        self.assertIn("import cycle through 3 files in fixture", out.getvalue())
        self.assertIn("src/a.rs -> src/b.rs -> src/c.rs -> src/a.rs", out.getvalue())
        self.assertIn("src/b.rs:1: crate::c::g", out.getvalue())

    def test_a_child_module_named_in_a_use_item_without_a_prefix_is_an_edge(self):
        crate = self.crate(
            {
                "src/lib.rs": "mod a;\nmod b;\n",
                "src/a.rs": "mod inner;\nuse inner::X;\n",
                "src/a/inner.rs": "pub struct X;\nuse crate::b::*;\n",
                "src/b.rs": "use crate::a::{self as _};\n",
            }
        )
        self.assertIn(("src/a.rs", "src/a/inner.rs"), self.rel_edges(crate))
        self.assertEqual(self.rel_cycles(crate), [["src/a.rs", "src/a/inner.rs", "src/b.rs"]])

    def test_use_trees_reach_every_module_they_name(self):
        crate = self.crate(
            {
                "src/lib.rs": "mod a;\nmod b;\nmod c;\nuse crate::{a::A, b::{self, B}, c::*};\n",
                "src/a.rs": "pub struct A;\n",
                "src/b.rs": "pub struct B;\n",
                "src/c.rs": "",
            }
        )
        self.assertEqual(
            self.rel_edges(crate),
            [("src/lib.rs", "src/a.rs"), ("src/lib.rs", "src/b.rs"), ("src/lib.rs", "src/c.rs")],
        )

    def test_a_path_attribute_names_the_file(self):
        crate = self.crate(
            {
                "src/lib.rs": '#[path = "elsewhere/x_impl.rs"]\nmod x;\nmod y;\n',
                "src/elsewhere/x_impl.rs": "pub fn f() { crate::y::g() }\n",
                "src/y.rs": "pub fn g() { super::x::f() }\n",
            }
        )
        self.assertEqual(self.rel_cycles(crate), [["src/elsewhere/x_impl.rs", "src/y.rs"]])

    def test_code_under_a_cfg_that_does_not_require_test_counts(self):
        crate = self.crate(
            {
                "src/lib.rs": "mod a;\nmod b;\n",
                "src/a.rs": '#[cfg(any(test, feature = "x"))]\nuse crate::b::B;\n',
                "src/b.rs": "pub struct B;\n#[cfg(not(test))]\nfn f() { crate::a::g() }\n",
            }
        )
        self.assertEqual(self.rel_cycles(crate), [["src/a.rs", "src/b.rs"]])


class NoFalseCycles(Fixture):
    def test_mod_declarations_are_not_edges(self):
        crate = self.crate(
            {
                "src/lib.rs": "pub mod a;\npub mod b;\npub struct Shared;\n",
                "src/a.rs": "use crate::Shared;\npub mod deeper;\n",
                "src/a/deeper.rs": "use super::super::Shared;\n",
                "src/b.rs": "use crate::a::deeper;\n",
            }
        )
        self.assertEqual(self.rel_cycles(crate), [])
        self.assertNotIn(("src/lib.rs", "src/a.rs"), self.rel_edges(crate))
        self.assertNotIn(("src/a.rs", "src/a/deeper.rs"), self.rel_edges(crate))

    def test_test_code_does_not_count(self):
        crate = self.crate(
            {
                "src/lib.rs": "mod a;\nmod b;\n",
                "src/a.rs": textwrap.dedent(
                    """\
                    pub fn used() {}
                    #[cfg(test)]
                    use crate::b::B;
                    #[cfg(test)]
                    mod tests {
                        use crate::b::*;
                        #[test]
                        fn t() { crate::b::helper(); }
                    }
                    #[cfg(all(test, feature = "slow"))]
                    fn slow() -> [u8; 2] { crate::b::bytes() }
                    #[cfg(test)]
                    mod more_tests;
                    """
                ),
                "src/a/more_tests.rs": "use crate::b::B;\n",
                "src/b.rs": "pub struct B;\npub fn helper() { crate::a::used() }\n",
            }
        )
        self.assertEqual(self.rel_edges(crate), [("src/b.rs", "src/a.rs")])
        self.assertEqual(self.rel_cycles(crate), [])
        self.assertNotIn(os.path.join(self.dir, "src/a/more_tests.rs"), crate.sources)

    def test_a_test_only_file_does_not_count(self):
        crate = self.crate(
            {
                "src/lib.rs": "mod a;\nmod b;\n",
                "src/a.rs": "#![cfg(test)]\nuse crate::b::B;\n",
                "src/b.rs": "pub struct B;\nuse crate::a as _;\n",
            }
        )
        self.assertEqual(self.rel_cycles(crate), [])

    def test_comments_and_strings_are_not_read(self):
        crate = self.crate(
            {
                "src/lib.rs": "mod a;\nmod b;\n",
                "src/a.rs": textwrap.dedent(
                    """\
                    // use crate::b::B;
                    /* crate::b::f() /* nested */ crate::b::g() */
                    /// Calls [`crate::b::f`].
                    pub fn f() -> &'static str { "crate::b::f" }
                    pub fn r() -> &'static str { r#"use crate::b::B; "# }
                    pub fn c() -> char { '"' }
                    pub fn lifetime<'a>(x: &'a str) -> &'a str { x }
                    """
                ),
                "src/b.rs": "pub fn g() { crate::a::f(); }\n",
            }
        )
        self.assertEqual(self.rel_edges(crate), [("src/b.rs", "src/a.rs")])

    def test_super_inside_an_inline_module_stays_in_its_file(self):
        crate = self.crate(
            {
                "src/lib.rs": "mod a;\nmod b;\npub struct Root;\n",
                "src/a.rs": "pub struct A;\nmod inner {\n    use super::A;\n    pub fn f() -> A { super::A }\n}\n",
                "src/b.rs": "use crate::a::A;\n",
            }
        )
        self.assertEqual(self.rel_edges(crate), [("src/b.rs", "src/a.rs")])

    def test_visibility_paths_are_not_uses(self):
        crate = self.crate(
            {
                "src/lib.rs": "pub mod a;\nmod b;\n",
                "src/a.rs": "pub mod x;\n",
                "src/a/x.rs": "pub(in crate::a) fn f() {}\npub(crate) fn g() {}\npub(super) fn h() {}\n",
                "src/b.rs": "",
            }
        )
        self.assertEqual(self.rel_edges(crate), [])


RULES = """\
[crates]
one = { deps = [] }

[layers.one]
src = "one/src"
rows = [["lib.rs"], ["a.rs", "b.rs"]]
"""


class Workspace(Fixture):
    """The command itself, over a workspace that cargo metadata reads."""

    def workspace(self, b_uses_a, rules=RULES):
        self.write(
            {
                "Cargo.toml": '[workspace]\nresolver = "2"\nmembers = ["one"]\n',
                "one/Cargo.toml": '[package]\nname = "one"\nversion = "0.1.0"\nedition = "2021"\n',
                "one/src/lib.rs": "mod a;\nmod b;\n",
                "one/src/a.rs": "pub fn f() {}\n",
                "one/src/b.rs": "pub fn g() {}\n" + ("use crate::a::f;\n" if b_uses_a else ""),
                "scripts/layers.toml": rules,
            }
        )

    def run_check(self, *extra):
        return subprocess.run(
            [sys.executable, os.path.join(HERE, "check-imports.py"), "--workspace", self.dir, *extra],
            capture_output=True,
            text=True,
        )

    def test_fails_naming_the_cycle(self):
        self.workspace(b_uses_a=True, rules="[crates]\none = { deps = [] }\n")
        self.write({"one/src/a.rs": "pub fn f() { crate::b::g() }\n"})
        out = self.run_check()
        self.assertEqual(out.returncode, 1, out.stdout + out.stderr)
        self.assertIn("import cycle through 2 files in one (lib one)", out.stdout)
        self.assertIn("one/src/a.rs -> one/src/b.rs -> one/src/a.rs", out.stdout)

    def test_passes_without_one(self):
        self.workspace(b_uses_a=False)
        out = self.run_check()
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("no import cycle", out.stdout)
        self.assertIn("the layers of one kept", out.stdout)

    def test_a_missing_module_file_is_an_error(self):
        self.workspace(b_uses_a=False)
        self.write({"one/src/lib.rs": "mod a;\nmod b;\nmod gone;\n"})
        out = self.run_check()
        self.assertEqual(out.returncode, 2, out.stdout + out.stderr)
        self.assertIn("one/src/lib.rs:3: no file for `mod gone;`", out.stderr)

    def test_a_file_naming_one_beside_it_in_its_row_fails(self):
        self.workspace(b_uses_a=True)
        out = self.run_check()
        self.assertEqual(out.returncode, 1, out.stdout + out.stderr)
        self.assertIn("layer crossed in one (lib one): one/src/b.rs (b.rs) names one/src/a.rs (a.rs, beside it)", out.stdout)
        self.assertIn("one/src/b.rs:2: use crate::a::f", out.stdout)

    def test_a_file_naming_one_above_it_fails_and_below_passes(self):
        rows = 'rows = [["lib.rs"], ["b.rs"], ["a.rs"]]'
        self.workspace(b_uses_a=True, rules=RULES.replace('rows = [["lib.rs"], ["a.rs", "b.rs"]]', rows))
        self.assertEqual(self.run_check().returncode, 0, "b above a: b may name a")
        rows = 'rows = [["lib.rs"], ["a.rs"], ["b.rs"]]'
        self.workspace(b_uses_a=True, rules=RULES.replace('rows = [["lib.rs"], ["a.rs", "b.rs"]]', rows))
        out = self.run_check()
        self.assertEqual(out.returncode, 1, out.stdout + out.stderr)
        self.assertIn("one/src/b.rs (b.rs) names one/src/a.rs (a.rs, above it)", out.stdout)

    def test_a_file_the_table_does_not_place_fails(self):
        self.workspace(b_uses_a=False, rules=RULES.replace('["a.rs", "b.rs"]', '["a.rs"]'))
        out = self.run_check()
        self.assertEqual(out.returncode, 1, out.stdout + out.stderr)
        self.assertIn("file placed in no layer of one (lib one): one/src/b.rs", out.stdout)

    def test_a_folder_entry_places_the_folder_and_its_twin_file(self):
        layers = check_imports.Layers(self.dir, {"src": "s", "rows": [["lib.rs"], ["hooks", "abi.rs"]]})
        at = lambda p: layers.group_of(os.path.join(self.dir, "s", p))  # noqa: E731
        self.assertEqual(at("hooks.rs"), (1, "hooks"))
        self.assertEqual(at("hooks/nvml/mod.rs"), (1, "hooks"))
        self.assertEqual(at("abi.rs"), (1, "abi.rs"))
        self.assertIsNone(at("hooksmith.rs"))
        self.assertEqual(at("abi/x.rs"), (1, "abi.rs"), "a module's children are the module's")

    def test_a_crate_arrow_the_table_does_not_allow_fails(self):
        self.workspace(b_uses_a=False)
        self.write(
            {
                "Cargo.toml": '[workspace]\nresolver = "2"\nmembers = ["one", "two"]\n',
                "one/Cargo.toml": '[package]\nname = "one"\nversion = "0.1.0"\nedition = "2021"\n\n[dependencies]\ntwo = { path = "../two" }\n',
                "two/Cargo.toml": '[package]\nname = "two"\nversion = "0.1.0"\nedition = "2021"\n',
                "two/src/lib.rs": "",
                "scripts/layers.toml": RULES.replace('one = { deps = [] }', 'one = { deps = [] }\ntwo = { deps = [] }'),
            }
        )
        out = self.run_check()
        self.assertEqual(out.returncode, 1, out.stdout + out.stderr)
        self.assertIn("crate arrow not allowed: one -> two (normal dependency)", out.stdout)
        self.write({"scripts/layers.toml": RULES.replace('one = { deps = [] }', 'one = { deps = ["two"] }\ntwo = { deps = [] }')})
        self.assertEqual(self.run_check().returncode, 0)
        self.write({"scripts/layers.toml": RULES.replace('one = { deps = [] }', 'one = { deps = ["two"] }')})
        out = self.run_check()
        self.assertEqual(out.returncode, 1, out.stdout + out.stderr)
        self.assertIn("crate arrow: two: the member is not in the table's [crates]", out.stdout)

    def test_the_document_must_show_the_table(self):
        self.workspace(b_uses_a=False, rules='doc = "ARCH.md"\n' + RULES)
        self.write({"ARCH.md": "# House\n\nNo copy here.\n"})
        out = self.run_check()
        self.assertEqual(out.returncode, 1, out.stdout + out.stderr)
        self.assertIn("ARCH.md: it has no line <!-- scripts/layers.toml -->", out.stdout)
        with open(os.path.join(self.dir, "scripts/layers.toml"), encoding="utf-8") as f:
            table = f.read()
        self.write({"ARCH.md": "# House\n\n<!-- scripts/layers.toml -->\n```toml\n" + table + "```\n"})
        self.assertEqual(self.run_check().returncode, 0, self.run_check().stdout)
        self.write({"ARCH.md": "# House\n\n<!-- scripts/layers.toml -->\n```toml\n" + table.replace("a.rs", "c.rs") + "```\n"})
        out = self.run_check()
        self.assertEqual(out.returncode, 1, out.stdout + out.stderr)
        self.assertIn("its copy of the table differs", out.stdout)


class TheRealTable(unittest.TestCase):
    """scripts/layers.toml itself: the rules the issue asks for are in it."""

    def test_the_shim_stands_on_nothing_of_the_tools_and_keeps_its_order(self):
        rules = check_imports.load_rules(os.path.join(HERE, "layers.toml"))
        shim = set(rules["crates"]["fgpu-shim"]["deps"])
        self.assertFalse(shim & {"fgpu-cli", "fgpu-cdi", "fgpu-kubelet-plugin"}, shim)
        self.assertEqual(rules["crates"]["fgpu-core"]["deps"], [], "core touches no driver")
        self.assertEqual(
            rules["layers"]["fgpu-shim"]["rows"],
            [["lib.rs"], ["hooks"], ["accounting", "compute"], ["process"], ["driver"], ["abi.rs"]],
        )
        cli = rules["layers"]["fgpu-cli"]["rows"]
        self.assertEqual(cli[0], ["main.rs"])
        self.assertIn("driver", cli[-1])


if __name__ == "__main__":
    unittest.main()
