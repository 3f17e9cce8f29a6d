//! The configuration reference page, made from the config file's JSON Schema
//! ([`crate::config::schema::schema`]): a table per section, a row per key with its type,
//! default and description.

use std::fmt::Write as _;

use serde_json::{Map, Value};

/// The page's opening, before the sections.
const INTRO: &str = "\
Every key a host config file may hold, by section, with its type and default. A key not listed
here is refused with its line and column; sizes take a number of bytes or a unit (`\"64MiB\"`,
`\"8MB\"`), durations take humantime text (`\"500ms\"`, `\"30s\"`, `\"5m\"`, `\"1h 30m\"`).

`host/demo.toml` is a complete, commented configuration. A config with mistakes is refused
with every mistake at once, each with its field path. What the options mean for a route's
guarantees: [choose the guarantees](../choose/index.md); for a route's limits:
[limits](../handler/limits.md).

`dedup-host schema` prints the same as a JSON Schema ([host.schema.json](host.schema.json)), so
an editor checks a config as it is typed: [editor set-up](editor.md).
";

/// Where a section is explained at length, linked under its heading.
const SEE_ALSO: &[(&str, &str)] = &[
    ("telemetry", "[traces](../operate/traces.md)"),
    ("console", "[the console](../operate/console.md)"),
    (
        "deployment",
        "[several deployments on one server](../deploy/deployments.md)",
    ),
    ("routes", "[choose the guarantees](../choose/index.md)"),
    ("limits", "[limits](../handler/limits.md)"),
    ("http", "[outbound HTTP calls](../handler/http.md)"),
];

/// The page, generated: the sections in the order of the schema's properties.
pub fn page(schema: &Value) -> String {
    let defs = schema["$defs"].as_object().cloned().unwrap_or_default();
    let mut out = String::from("# Configuration reference\n\n");
    out.push_str(super::GENERATED);
    out.push('\n');
    out.push_str(INTRO);
    for (key, property) in properties(schema) {
        let (def, list) = section_def(property, &defs);
        let Some(def) = def else { continue };
        let heading = if list {
            format!("`[[{key}]]` (one table per item)")
        } else {
            format!("`[{key}]`")
        };
        section(&mut out, &heading, key, def, &defs);
        if key == "routes" {
            if let Some(limits) = properties(def)
                .find(|(k, _)| *k == "limits")
                .and_then(|(_, p)| section_def(p, &defs).0)
            {
                let heading = "`[routes.limits]` (or `limits = { ... }` in a route)";
                section(&mut out, heading, "limits", limits, &defs);
            }
            // An optional table: its schema is `anyOf [the table, null]`.
            if let Some(http) = properties(def)
                .find(|(k, _)| *k == "http")
                .and_then(|(_, p)| p["anyOf"].as_array()?.iter().find_map(reference))
                .and_then(|name| defs.get(name))
            {
                section(&mut out, "`[routes.http]`", "http", http, &defs);
            }
        }
    }
    out
}

/// Writes one section: its description, where it is explained, and a row per key.
fn section(out: &mut String, heading: &str, key: &str, def: &Value, defs: &Map<String, Value>) {
    let _ = writeln!(out, "\n## {heading}\n");
    if let Some(text) = def["description"].as_str() {
        let _ = writeln!(out, "{}\n", super::paragraphs(text));
    }
    if let Some((_, link)) = SEE_ALSO.iter().find(|(k, _)| *k == key) {
        let _ = writeln!(out, "See {link}.\n");
    }
    out.push_str("| key | type | default | what |\n|---|---|---|---|\n");
    let required: Vec<&str> = def["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    for (name, property) in properties(def) {
        let default = match required.contains(&name) {
            true => "required".to_string(),
            false => default_text(property),
        };
        let _ = writeln!(
            out,
            "| `{name}` | {} | {default} | {} |",
            type_text(property, defs),
            super::cell(property["description"].as_str().unwrap_or("")),
        );
    }
}

/// The `properties` of an object schema, in the schema's order.
fn properties(schema: &Value) -> impl Iterator<Item = (&str, &Value)> {
    schema["properties"]
        .as_object()
        .into_iter()
        .flat_map(|m| m.iter().map(|(k, v)| (k.as_str(), v)))
}

/// The definition a section property refers to, and whether it is a list of tables.
fn section_def<'a>(property: &Value, defs: &'a Map<String, Value>) -> (Option<&'a Value>, bool) {
    let object = |name: Option<&str>| {
        name.and_then(|n| defs.get(n))
            .filter(|d| d.get("properties").is_some())
    };
    if let Some(name) = reference(property) {
        return (object(Some(name)), false);
    }
    (object(reference(&property["items"])), true)
}

/// The definition name a `$ref` points at.
fn reference(schema: &Value) -> Option<&str> {
    schema["$ref"].as_str()?.strip_prefix("#/$defs/")
}

/// What a key takes, in words: `integer ≥ 1`, `duration`, `one of \`a\`, \`b\``, ...
fn type_text(property: &Value, defs: &Map<String, Value>) -> String {
    if let Some(name) = reference(property) {
        return named_type(name, defs);
    }
    if let Some(any) = property["anyOf"].as_array() {
        let kinds: Vec<String> = any
            .iter()
            .filter(|s| s["type"] != "null")
            .map(|s| type_text(s, defs))
            .collect();
        return kinds.join(" or ");
    }
    let kind = match &property["type"] {
        Value::Array(kinds) => kinds
            .iter()
            .filter_map(Value::as_str)
            .find(|k| *k != "null")
            .unwrap_or("")
            .to_string(),
        Value::String(kind) => kind.clone(),
        _ => String::new(),
    };
    match kind.as_str() {
        "integer" if property["enum"].is_array() => {
            let values: Vec<String> = property["enum"]
                .as_array()
                .into_iter()
                .flatten()
                .map(Value::to_string)
                .collect();
            format!("one of {}", values.join(", "))
        }
        "integer" => {
            let mut text = "integer".to_string();
            if let Some(min) = property["minimum"].as_u64().filter(|m| *m > 0) {
                let _ = write!(text, " ≥ {min}");
            }
            if let Some(max) = property["maximum"].as_u64() {
                let _ = write!(text, " ≤ {max}");
            }
            text
        }
        "array" => format!("list of {}", type_text(&property["items"], defs)),
        "object" => "table of strings".to_string(),
        "boolean" => "bool".to_string(),
        "string" if property["format"] == "ip" || property["format"] == "socket-addr" => {
            "address".to_string()
        }
        "" => "any".to_string(),
        other => other.to_string(),
    }
}

/// The words for a named definition: a duration, a size, an enum's values, a key source.
fn named_type(name: &str, defs: &Map<String, Value>) -> String {
    let Some(def) = defs.get(name) else {
        return name.to_string();
    };
    match name {
        "Duration" => return "duration".to_string(),
        "Size" => return "size".to_string(),
        _ => {}
    }
    if let Some(values) = def["enum"].as_array() {
        return one_of(values.iter().filter_map(Value::as_str));
    }
    if let Some(variants) = def["oneOf"].as_array() {
        let consts: Vec<&str> = variants
            .iter()
            .filter_map(|v| v["const"].as_str().or_else(|| v["enum"][0].as_str()))
            .collect();
        if consts.len() == variants.len() {
            return one_of(consts.into_iter());
        }
        let tables: Vec<String> = variants
            .iter()
            .filter_map(|v| v["required"][0].as_str())
            .map(|k| format!("`{k}`"))
            .collect();
        return format!("a table with one of {}", tables.join(", "));
    }
    if def.get("properties").is_some() {
        return "table".to_string();
    }
    name.to_string()
}

/// `one of \`a\`, \`b\``.
fn one_of<'a>(values: impl Iterator<Item = &'a str>) -> String {
    let values: Vec<String> = values.map(|v| format!("`{v}`")).collect();
    format!("one of {}", values.join(", "))
}

/// A key's default as a reader writes it in TOML, or in words.
fn default_text(property: &Value) -> String {
    if let Some(words) = property["x-default-text"].as_str() {
        return words.to_string();
    }
    match property.get("default") {
        None | Some(Value::Null) => "none".to_string(),
        Some(Value::String(s)) => format!("`\"{s}\"`"),
        Some(Value::Array(items)) if items.is_empty() => "`[]`".to_string(),
        Some(Value::Object(map)) if map.is_empty() => "`{}`".to_string(),
        Some(other) => format!("`{}`", toml_value(other)),
    }
}

/// A JSON value written as TOML would write it (strings quoted, lists bracketed).
fn toml_value(value: &Value) -> String {
    match value {
        Value::String(s) => format!("\"{s}\""),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(toml_value).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(map) => {
            let items: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{k} = {}", toml_value(v)))
                .collect();
            format!("{{ {} }}", items.join(", "))
        }
        other => other.to_string(),
    }
}
