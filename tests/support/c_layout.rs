//! Checks Rust declarations of C types and constants against NVIDIA's own `cuda.h` and
//! `nvml.h`, with a C compiler as the judge.
//!
//! A test lists what it declares: each `#[repr(C)]` struct with, for every Rust field, the
//! C member it stands for (the [`c_struct!`] macro, which also fails to compile when a Rust
//! field is left out), and each constant with the C expression it must equal. Offsets,
//! sizes and alignments on the Rust side come from the Rust compiler (`offset_of!`,
//! `size_of`, `align_of`). This module then writes a C program per header that prints
//! `offsetof`, `sizeof` and `_Alignof` of every member named, and the value of every
//! expression, compiles it with `cc` against the headers, runs it, and compares. A member
//! or name the header lacks is a compile error, shown with the generated file.
//!
//! Which headers: the pins of `tests/abi/requirements.txt`, extracted by
//! `scripts/get-nvidia-headers.sh` into `$FGPU_TEST_NVIDIA_HEADERS` (tests/run.sh sets it;
//! the default is `target/nvidia-headers`). A struct is checked against every pinned header
//! of its kind that declares its C type (sizes, alignments and every member), unless
//! [`Struct::fields_only_in`] names one header and says why the others name the members
//! differently: then the members are checked against that header and size and alignment
//! against all. [`Struct::pin`] and [`Value::pin`] tie a whole check to one header (a
//! layout only one release had). A constant is checked against every header of its kind
//! that names all identifiers of its expression. A check that no header can answer fails.

use crate::paths::target_dir;
use crate::process::Cmd;
use std::fmt::Write as _;
use std::process::Command;

mod headers;
pub mod prototypes;

pub use headers::{header_sets, Header, HeaderSet};
use prototypes::{parse_shape, prototype_program};
pub use prototypes::{Base, CShape, Prototype, Shape};

/// One Rust field and the C member (a designator such as `allocFlags.usage`) it stands for.
#[derive(Clone, Debug)]
pub struct Field {
    pub rust: &'static str,
    pub c: &'static str,
    pub offset: usize,
    pub size: usize,
    pub align: usize,
}

/// A `#[repr(C)]` Rust struct and the C type it declares.
#[derive(Clone, Debug)]
pub struct Struct {
    /// Where the Rust type lives, for messages (`shim::abi::cuda::CUuuid`).
    pub rust: String,
    pub header: Header,
    pub c_type: &'static str,
    pub size: usize,
    pub align: usize,
    pub fields: Vec<Field>,
    pub defines: Vec<&'static str>,
    pub pin: Option<&'static str>,
    pub fields_only_in: Option<(&'static str, &'static str)>,
}

impl Struct {
    /// Checks against this one pinned header (`name==version`) only.
    pub fn pin(mut self, pin: &'static str) -> Self {
        self.pin = Some(pin);
        self
    }

    /// Compiles the check with `#define NAME` before the header (for declarations a header
    /// keeps behind a macro, such as cuda.h's `_v1` structs).
    pub fn define(mut self, name: &'static str) -> Self {
        self.defines.push(name);
        self
    }

    /// Checks members against the pinned header `pin` only, for the `reason` given; size and
    /// alignment still against every header that declares the type.
    pub fn fields_only_in(mut self, pin: &'static str, reason: &'static str) -> Self {
        self.fields_only_in = Some((pin, reason));
        self
    }

    /// The C type to check against, when one Rust type stands for several.
    pub fn c_type(mut self, c_type: &'static str) -> Self {
        self.c_type = c_type;
        self
    }
}

/// Size and alignment of the field a projection closure returns (used by [`c_struct!`]).
pub fn field_layout<T, F>(_project: fn(&T) -> &F) -> (usize, usize) {
    (std::mem::size_of::<F>(), std::mem::align_of::<F>())
}

/// `c_struct!(Header::Cuda, path::RustType => "CType" { rust_field => "cMember", ... })`
/// describes a `#[repr(C)]` struct for [`Checks::push`]. Every field of the Rust type must
/// be listed (a missing one is a compile error), each with the C member it stands for.
#[macro_export]
macro_rules! c_struct {
    ($header:expr, $t:path => $c:literal { $($f:ident => $cf:literal),+ $(,)? }) => {{
        #[allow(dead_code, clippy::needless_borrow)]
        fn every_field_listed(v: &$t) {
            let $t { $($f: _),+ } = v;
        }
        $crate::c_layout::Struct {
            rust: stringify!($t).replace(' ', ""),
            header: $header,
            c_type: $c,
            size: std::mem::size_of::<$t>(),
            align: std::mem::align_of::<$t>(),
            fields: vec![$({
                let (size, align) = $crate::c_layout::field_layout(|v: &$t| &v.$f);
                $crate::c_layout::Field { rust: stringify!($f), c: $cf, offset: std::mem::offset_of!($t, $f), size, align }
            }),+],
            defines: Vec::new(),
            pin: None,
            fields_only_in: None,
        }
    }};
}

/// A Rust constant and the C expression (usually one enumerator or macro) it must equal.
#[derive(Clone, Debug)]
pub struct Value {
    pub rust: String,
    pub header: Header,
    pub c_expr: String,
    pub value: i128,
    pub pin: Option<&'static str>,
}

impl Value {
    pub fn new(header: Header, rust: impl Into<String>, c_expr: impl Into<String>, value: i128) -> Value {
        Value { rust: rust.into(), header, c_expr: c_expr.into(), value, pin: None }
    }

    /// Checks against this one pinned header (`name==version`) only.
    pub fn pin(mut self, pin: &'static str) -> Self {
        self.pin = Some(pin);
        self
    }
}

/// `c_value!(Header::Cuda, path::CONST)`: the constant against the C name it is spelled
/// as; `c_value!(Header::Cuda, path::CONST => "C expression")` otherwise.
#[macro_export]
macro_rules! c_value {
    ($header:expr, $($p:ident)::+ => $c:expr) => {
        $crate::c_layout::Value::new($header, stringify!($($p)::+).replace(' ', ""), $c, $($p)::+ as i128)
    };
    ($header:expr, $($p:ident)::+) => {
        $crate::c_layout::Value::new($header, stringify!($($p)::+).replace(' ', ""), $crate::c_layout::last_segment(stringify!($($p)::+)), $($p)::+ as i128)
    };
}

/// The last `::` segment of a path (the C name of a constant spelled as in C).
pub fn last_segment(path: &str) -> &str {
    path.rsplit("::").next().unwrap_or(path).trim()
}

/// What one compiled probe reports for a check.
enum Probe {
    Struct { index: usize, full: bool },
    Value { index: usize },
}

/// A list of checks, run together by [`Checks::run`].
#[derive(Default)]
pub struct Checks {
    structs: Vec<Struct>,
    values: Vec<Value>,
    prototypes: Vec<Prototype>,
}

impl Checks {
    pub fn new() -> Checks {
        Checks::default()
    }

    pub fn push(&mut self, s: Struct) {
        self.structs.push(s);
    }

    pub fn value(&mut self, v: Value) {
        self.values.push(v);
    }

    pub fn prototype(&mut self, p: Prototype) {
        self.prototypes.push(p);
    }

    /// The Rust name (its last path segment) of every struct and constant checked, and
    /// every prototype's: what a test compares with all that a crate declares.
    pub fn names(&self) -> Vec<&str> {
        let structs = self.structs.iter().map(|s| last_segment(&s.rust));
        let values = self.values.iter().map(|v| last_segment(&v.rust));
        structs.chain(values).chain(self.prototypes.iter().map(|p| p.name)).collect()
    }

    /// Runs every check against the pinned headers; panics listing every disagreement.
    /// Returns what was checked, one line per check and header (also printed), or `None`
    /// when the headers are not fetched (outside CI only).
    pub fn run(&self, name: &str) -> Option<Vec<String>> {
        let sets = header_sets()?;
        let mut problems = Vec::new();
        let mut checked = Vec::new();
        // Per header set and list of defines: the probes of one C program.
        let mut programs: Vec<(usize, Vec<&'static str>, Vec<Probe>)> = Vec::new();
        let mut add = |set: usize, defines: &[&'static str], probe: Probe| {
            if let Some(p) = programs.iter_mut().find(|(s, d, _)| *s == set && d.as_slice() == defines) {
                p.2.push(probe);
            } else {
                programs.push((set, defines.to_vec(), vec![probe]));
            }
        };
        for (index, s) in self.structs.iter().enumerate() {
            let declaring: Vec<usize> = sets
                .iter()
                .enumerate()
                .filter(|(_, set)| set.header == s.header && s.pin.is_none_or(|p| p == set.pin) && set.declares(s.c_type))
                .map(|(i, _)| i)
                .collect();
            if declaring.is_empty() {
                problems.push(format!(
                    "{} ({}): no pinned {} declares it{}",
                    s.rust,
                    s.c_type,
                    s.header.file(),
                    s.pin.map(|p| format!(" (pinned to {p})")).unwrap_or_default()
                ));
                continue;
            }
            if let Some((pin, _)) = s.fields_only_in {
                if !declaring.iter().any(|&i| sets[i].pin == pin) {
                    problems.push(format!("{} ({}): {pin}, against which its fields are checked, does not declare it", s.rust, s.c_type));
                }
            }
            for &set in &declaring {
                let full = s.fields_only_in.is_none_or(|(pin, _)| sets[set].pin == pin);
                add(set, &s.defines, Probe::Struct { index, full });
            }
        }
        for (index, v) in self.values.iter().enumerate() {
            let idents = identifiers(&v.c_expr);
            let naming: Vec<usize> = sets
                .iter()
                .enumerate()
                .filter(|(_, set)| set.header == v.header && v.pin.is_none_or(|p| p == set.pin) && idents.iter().all(|i| set.declares(i)))
                .map(|(i, _)| i)
                .collect();
            if naming.is_empty() {
                problems.push(format!("{} ({}): no pinned {} names it", v.rust, v.c_expr, v.header.file()));
            }
            for set in naming {
                add(set, &[], Probe::Value { index });
            }
        }

        let dir = target_dir().join("c-layout");
        std::fs::create_dir_all(&dir).unwrap();
        for (n, (set_index, defines, probes)) in programs.iter().enumerate() {
            let set = &sets[*set_index];
            let source = dir.join(format!("{name}-{n}.c"));
            std::fs::write(&source, self.program(set, defines, probes)).unwrap();
            let exe = source.with_extension("");
            let mut cc = Command::new("cc");
            cc.args(["-std=gnu11", "-Wall", "-Werror", "-I"]).arg(&set.include).arg("-o").arg(&exe).arg(&source);
            Cmd(cc).success();
            let run = Cmd(Command::new(&exe)).success();
            let out = run.stdout();
            let mut lines = out.lines();
            for probe in probes {
                let mut next = || -> Vec<u64> {
                    let line = lines.next().unwrap_or_else(|| panic!("{} ended early\n{run}", exe.display()));
                    line.split_whitespace().map(|w| w.parse::<i128>().unwrap_or_else(|_| panic!("bad line {line:?}")) as u64).collect()
                };
                let against = format!("{} of {}", set.header.file(), set.pin);
                match *probe {
                    Probe::Struct { index, full } => {
                        let s = &self.structs[index];
                        let whole = next();
                        let c = (whole[0] as usize, whole[1] as usize);
                        if (s.size, s.align) != c {
                            problems
                                .push(format!("{} ({}), {against}: Rust size {} align {}, C size {} align {}", s.rust, s.c_type, s.size, s.align, c.0, c.1));
                        }
                        if full {
                            for f in &s.fields {
                                let m = next();
                                let c = (m[0] as usize, m[1] as usize, m[2] as usize);
                                if (f.offset, f.size, f.align) != c {
                                    problems.push(format!(
                                        "{}.{} ({}.{}), {against}: Rust offset {} size {} align {}, C offset {} size {} align {}",
                                        s.rust, f.rust, s.c_type, f.c, f.offset, f.size, f.align, c.0, c.1, c.2
                                    ));
                                }
                            }
                        }
                        let what = if full {
                            format!("size, alignment and {} fields", s.fields.len())
                        } else {
                            format!(
                                "size and alignment (fields against {}: {})",
                                s.fields_only_in.unwrap_or_default().0,
                                s.fields_only_in.unwrap_or_default().1
                            )
                        };
                        checked.push(format!("struct {} = {}: {what}, {against}", s.rust, s.c_type));
                    }
                    Probe::Value { index } => {
                        let v = &self.values[index];
                        let c = next()[0] as i64 as i128;
                        let rust = v.value as i64 as i128;
                        if rust != c {
                            problems.push(format!("{} ({}), {against}: Rust {} (0x{:x}), C {} (0x{:x})", v.rust, v.c_expr, v.value, v.value, c, c));
                        }
                        checked.push(format!("value {} = {} ({}), {against}", v.rust, v.c_expr, v.value));
                    }
                }
            }
        }
        if !self.prototypes.is_empty() {
            self.run_prototypes(name, &sets, &dir, &mut checked, &mut problems);
        }
        for line in &checked {
            println!("checked {line}");
        }
        println!(
            "{name}: {} structs, {} constants and {} prototypes, {} checks against {} headers",
            self.structs.len(),
            self.values.len(),
            self.prototypes.len(),
            checked.len(),
            sets.len()
        );
        assert!(
            problems.is_empty(),
            "{name}: the Rust declarations disagree with NVIDIA's headers:\n  {}\n(generated C programs in {})",
            problems.join("\n  "),
            dir.display()
        );
        Some(checked)
    }

    /// The C program printing, one line per probe, what the header says.
    fn program(&self, set: &HeaderSet, defines: &[&str], probes: &[Probe]) -> String {
        let mut c = String::from("/* Generated by tests/support/c_layout.rs: one line per check. */\n");
        for d in defines {
            writeln!(c, "#define {d}").unwrap();
        }
        writeln!(c, "#include <stddef.h>\n#include <stdio.h>\n#include <{}>\n", set.header.file()).unwrap();
        c.push_str("#define WHOLE(T) printf(\"%zu %zu\\n\", sizeof(T), _Alignof(T))\n");
        c.push_str("#define MEMBER(T, m) printf(\"%zu %zu %zu\\n\", offsetof(T, m), sizeof(((T *)0)->m), _Alignof(__typeof__(((T *)0)->m)))\n");
        c.push_str("#define VALUE(e) printf(\"%lld\\n\", (long long)(e))\n\nint main(void) {\n");
        for probe in probes {
            match *probe {
                Probe::Struct { index, full } => {
                    let s = &self.structs[index];
                    writeln!(c, "    /* {} */\n    WHOLE({});", s.rust, s.c_type).unwrap();
                    if full {
                        for f in &s.fields {
                            writeln!(c, "    MEMBER({}, {}); /* {} */", s.c_type, f.c, f.rust).unwrap();
                        }
                    }
                }
                Probe::Value { index } => {
                    let v = &self.values[index];
                    writeln!(c, "    VALUE({}); /* {} */", v.c_expr, v.rust).unwrap();
                }
            }
        }
        c.push_str("    return 0;\n}\n");
        c
    }
}

impl Checks {
    /// One C++ program per pinned header that prints, for each function it declares, the
    /// shape of its return value and of each parameter (templates over the function's
    /// type), compared with the Rust declarations.
    fn run_prototypes(&self, name: &str, sets: &[HeaderSet], dir: &std::path::Path, checked: &mut Vec<String>, problems: &mut Vec<String>) {
        if !crate::prerequisite(
            Command::new("c++").arg("--version").output().is_ok_and(|o| o.status.success()),
            "a C++ compiler (`c++`) for the prototype checks",
        ) {
            return;
        }
        let mut declared: Vec<bool> = vec![false; self.prototypes.len()];
        for (n, set) in sets.iter().enumerate() {
            // cuda.h spells the per-thread-stream variants `__CUDA_API_PTSZ(name)`: they are
            // declared where their base name is (the compiler then finds them or fails).
            let declares = |name: &str| {
                set.declares(name)
                    || (set.header == Header::Cuda && name.strip_suffix("_ptsz").or(name.strip_suffix("_ptds")).is_some_and(|base| set.declares(base)))
            };
            let here: Vec<usize> =
                (0..self.prototypes.len()).filter(|&i| self.prototypes[i].header == set.header && declares(self.prototypes[i].name)).collect();
            if here.is_empty() {
                continue;
            }
            let source = dir.join(format!("{name}-prototypes-{n}.cpp"));
            std::fs::write(&source, prototype_program(set, here.iter().map(|&i| self.prototypes[i].name))).unwrap();
            let exe = source.with_extension("");
            let mut cxx = Command::new("c++");
            cxx.args(["-std=c++17", "-Wall", "-Werror", "-I"]).arg(&set.include).arg("-o").arg(&exe).arg(&source);
            Cmd(cxx).success();
            let run = Cmd(Command::new(&exe)).success();
            let out = run.stdout();
            let mut lines = out.lines();
            let against = format!("{} of {}", set.header.file(), set.pin);
            for &i in &here {
                declared[i] = true;
                let p = &self.prototypes[i];
                let line = lines.next().unwrap_or_else(|| panic!("{} ended early\n{run}", exe.display()));
                let mut shapes = line.split('|').skip(1).map(|field| parse_shape(field).unwrap_or_else(|| panic!("bad field {field:?} in {line:?}")));
                let ret = shapes.next().expect("a return type");
                let params: Vec<Shape> = shapes.collect();
                let mut wrong = Vec::new();
                if !p.ret.stands_for(&ret) {
                    wrong.push(format!("returns {} in Rust, {ret} in C", p.ret));
                }
                if params.len() != p.params.len() {
                    wrong.push(format!("{} parameters in Rust, {} in C", p.params.len(), params.len()));
                }
                for (k, ((param, rust), c)) in p.params.iter().zip(&params).enumerate() {
                    if !rust.stands_for(c) {
                        wrong.push(format!("parameter {} ({param}) is {rust} in Rust, {c} in C", k + 1));
                    }
                }
                let excused = p.differs_in.iter().find(|(pin, _)| *pin == set.pin);
                match (wrong.is_empty(), excused) {
                    (true, None) => checked.push(format!("prototype {}: return value and {} parameters, {against}", p.name, p.params.len())),
                    (false, Some((_, why))) => checked.push(format!("prototype {}: differs as known ({}), {against}: {why}", p.name, wrong.join("; "))),
                    (true, Some(_)) => problems.push(format!("{}, {against}: said to differ, but agrees (drop the exception)", p.name)),
                    (false, None) => problems.push(format!("{}, {against}: {}", p.name, wrong.join("; "))),
                }
            }
        }
        for (p, seen) in self.prototypes.iter().zip(declared) {
            if !seen {
                problems.push(format!("{}: no pinned {} declares it", p.name, p.header.file()));
            }
        }
    }
}

/// The C identifiers an expression uses (casts' type names included).
fn identifiers(expr: &str) -> Vec<&str> {
    expr.split(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_'))
        .filter(|w| w.starts_with(|ch: char| ch.is_ascii_alphabetic() || ch == '_'))
        .filter(|w| !matches!(*w, "sizeof" | "unsigned" | "int" | "long" | "char" | "short" | "void"))
        .collect()
}
