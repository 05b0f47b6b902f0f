//! The YAML a CDI spec is written as: JSON's values in YAML's block style, short lists
//! of scalars in flow style.

use serde_json::Value;
use std::fmt::Write as _;

/// Block-style YAML for the spec. Strings are written as JSON strings, which YAML reads as
/// double-quoted scalars with the same escapes; lists of strings in flow style (`[...]`).
pub fn to_yaml(value: &Value) -> String {
    let mut out = String::new();
    yaml_map_body(value, 0, &mut out);
    out
}

fn scalar(value: &Value) -> String {
    serde_json::to_string(value).expect("JSON values serialise")
}

fn is_flow(value: &Value) -> bool {
    match value {
        Value::Array(items) => items.iter().all(|v| !v.is_array() && !v.is_object()),
        Value::Object(map) => map.is_empty(),
        _ => true,
    }
}

fn yaml_map_body(value: &Value, indent: usize, out: &mut String) {
    let Value::Object(map) = value else { return };
    for (i, (key, item)) in map.iter().enumerate() {
        // The first key of a list item goes on the dash's line.
        if i > 0 || !out.ends_with("- ") {
            out.push_str(&" ".repeat(indent));
        }
        if is_flow(item) {
            let _ = writeln!(out, "{key}: {}", scalar(item));
        } else {
            let _ = writeln!(out, "{key}:");
            yaml_block(item, indent + 2, out);
        }
    }
}

fn yaml_block(value: &Value, indent: usize, out: &mut String) {
    match value {
        Value::Array(items) => {
            for item in items {
                out.push_str(&" ".repeat(indent));
                out.push_str("- ");
                if is_flow(item) {
                    let _ = writeln!(out, "{}", scalar(item));
                } else if item.is_object() {
                    yaml_map_body(item, indent + 2, out);
                } else {
                    out.push('\n');
                    yaml_block(item, indent + 2, out);
                }
            }
        }
        Value::Object(_) => yaml_map_body(value, indent, out),
        _ => {
            let _ = writeln!(out, "{}{}", " ".repeat(indent), scalar(value));
        }
    }
}
