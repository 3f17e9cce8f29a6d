//! A route's config shown as the TOML its user writes (`key = { subject_token = 2 }`,
//! `deadline = "30s"`), not as Rust values. The route is serialized with the same serde
//! derives that read it, and compared key by key with a route that sets nothing: a value
//! equal to the default is marked `# default`, and a setting left unset is shown as a
//! comment with the value in effect (`host.concurrency`, `3 x deadline`). The guest's
//! `config` values are never shown (they may be secrets), only their keys.

use std::collections::BTreeSet;

use toml::{Table, Value};

use crate::config::{HostConfig, RouteConfig};
use crate::limits::Limits;

/// One line of the shown TOML.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// The line: a `key = value` pair, a `[section]` header or a `#` comment.
    pub text: String,
    /// Whether it states a default (shown dimmed).
    pub default: bool,
}

impl Line {
    fn new(text: String, default: bool) -> Self {
        Self { text, default }
    }
}

/// The guest's values, whose values are never shown.
const SECRET: &str = "config";
/// The settings every route writes (never marked as defaults).
const REQUIRED: [&str; 2] = ["name", "subject"];
/// The route tables shown as sections of their own rather than inline.
const SECTIONS: [&str; 2] = ["limits", SECRET];

/// `route` as TOML lines, defaults marked; `host` gives the values an unset setting takes.
pub fn lines(route: &RouteConfig, host: &HostConfig) -> Vec<Line> {
    let actual = table_of(route);
    let defaults = defaults(route).map(|d| table_of(&d)).unwrap_or_default();
    let order = key_order(&toml::to_string(route).unwrap_or_default());
    let mut out = vec![Line::new("[[routes]]".into(), false)];
    let mut sections = Vec::new();
    for key in ordered(&actual, &order.top) {
        let value = &actual[&key];
        if SECTIONS.contains(&key.as_str()) {
            sections.push(key);
            continue;
        }
        let default = !REQUIRED.contains(&key.as_str()) && defaults.get(&key) == Some(value);
        out.push(pair(&key, value, default));
    }
    for key in unset(&actual, fields::<RouteConfig>()) {
        out.push(Line::new(unset_route_value(route, host, &key), true));
    }
    for key in sections {
        let Some(Value::Table(table)) = actual.get(&key) else {
            continue;
        };
        let empty = Table::new();
        let default_table = match defaults.get(&key) {
            Some(Value::Table(t)) => t,
            _ => &empty,
        };
        out.push(Line::new(String::new(), false));
        out.push(Line::new(format!("[routes.{key}]"), false));
        let inner = order.sections.iter().find(|(name, _)| *name == key);
        let inner_order = inner.map(|(_, keys)| keys.as_slice()).unwrap_or_default();
        if key == SECRET {
            if table.is_empty() {
                out.push(Line::new("# (none set)".into(), true));
            }
            for name in table.keys() {
                out.push(Line::new(
                    format!("# {} = (value not shown)", key_text(name)),
                    false,
                ));
            }
            continue;
        }
        for name in ordered(table, inner_order) {
            let default = default_table.get(&name) == Some(&table[&name]);
            out.push(pair(&name, &table[&name], default));
        }
        if key == "limits" {
            for name in unset(table, fields::<Limits>()) {
                out.push(Line::new(unset_limit(&route.limits, &name), true));
            }
        }
    }
    out
}

fn table_of<T: serde::Serialize>(value: &T) -> Table {
    match Value::try_from(value) {
        Ok(Value::Table(t)) => t,
        _ => Table::new(),
    }
}

/// A route with `route`'s name and subject and nothing else set.
fn defaults(route: &RouteConfig) -> Option<RouteConfig> {
    let mut t = Table::new();
    t.insert("name".into(), Value::String(route.name.clone()));
    t.insert("subject".into(), Value::String(route.subject.clone()));
    Value::Table(t).try_into().ok()
}

/// The keys of a route in the order its serialization writes them (its fields' order), top
/// level and per `[section]`.
#[derive(Debug, Default)]
struct KeyOrder {
    top: Vec<String>,
    sections: Vec<(String, Vec<String>)>,
}

fn key_order(text: &str) -> KeyOrder {
    let mut order = KeyOrder::default();
    for line in text.lines() {
        let line = line.trim();
        if let Some(header) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let top = header.split('.').next().unwrap_or(header).to_string();
            if !order.top.contains(&top) {
                order.top.push(top.clone());
            }
            order.sections.push((top, Vec::new()));
        } else if let Some((key, _)) = line.split_once(" = ") {
            let key = key.trim().to_string();
            match order.sections.last_mut() {
                Some((_, keys)) => keys.push(key),
                None => order.top.push(key),
            }
        }
    }
    order
}

/// `table`'s keys in `order`, then any others in name order.
fn ordered(table: &Table, order: &[String]) -> Vec<String> {
    let mut keys: Vec<String> = (order.iter())
        .filter(|k| table.contains_key(*k))
        .cloned()
        .collect();
    keys.extend(table.keys().filter(|k| !order.contains(k)).cloned());
    keys
}

/// The fields of a config struct, from its schema.
fn fields<T: schemars::JsonSchema>() -> BTreeSet<String> {
    let schema = schemars::schema_for!(T);
    (schema.get("properties").and_then(|p| p.as_object()))
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default()
}

fn unset(table: &Table, fields: BTreeSet<String>) -> Vec<String> {
    fields
        .into_iter()
        .filter(|f| !table.contains_key(f))
        .collect()
}

/// A key as TOML writes it: bare when it can be, quoted otherwise.
fn key_text(key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    match bare {
        true => key.to_string(),
        false => Value::String(key.to_string()).to_string(),
    }
}

fn pair(key: &str, value: &Value, default: bool) -> Line {
    let mut text = format!("{} = {value}", key_text(key));
    if default {
        text.push_str("  # default");
    }
    Line::new(text, default)
}

/// The comment for a route setting left unset: the value it takes and where from.
fn unset_route_value(route: &RouteConfig, host: &HostConfig, key: &str) -> String {
    let effective = match key {
        "partitions" => Some((route.partitions().to_string(), "default")),
        "concurrency" => Some((route.concurrency(host).to_string(), "host.concurrency")),
        "max_in_flight" => Some((route.max_in_flight(host).to_string(), "host.max_in_flight")),
        "ack" => Value::try_from(route.ack(host))
            .ok()
            .map(|v| (v.to_string(), "host.ack")),
        _ => None,
    };
    match effective {
        Some((value, from)) => format!("# {key} = {value}  # not set: {from}"),
        None => format!("# {key}: not set  # default"),
    }
}

/// The comment for a limit left unset.
fn unset_limit(limits: &Limits, key: &str) -> String {
    match key {
        "wall" => {
            let wall = humantime::format_duration(limits.wall_limit()).to_string();
            format!("# wall = {}  # not set: 3 x deadline", Value::String(wall))
        }
        _ => format!("# {key}: not set  # default"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KeySource;

    fn route(extra: &str) -> RouteConfig {
        toml::from_str(&format!("name = \"r\"\nsubject = \"in.>\"\n{extra}")).unwrap()
    }

    fn text(lines: &[Line]) -> String {
        let all: Vec<_> = lines.iter().map(|l| l.text.as_str()).collect();
        all.join("\n")
    }

    #[test]
    fn a_route_reads_as_the_toml_its_user_writes_with_defaults_marked() {
        let r = route(
            "key = { subject_token = 2 }\nconcurrency = 3\n[limits]\ndeadline = \"5s\"\n[config]\ntoken = \"s3cret\"",
        );
        assert_eq!(r.key, KeySource::SubjectToken(2));
        let host = HostConfig::default();
        let shown = text(&lines(&r, &host));
        for want in [
            "[[routes]]",
            "name = \"r\"\n",
            "key = { subject_token = 2 }",
            "concurrency = 3\n",
            "missing_key = \"dead_letter\"  # default",
            "[routes.limits]",
            "deadline = \"5s\"\n",
            "instances = 64  # default",
            "# wall = \"15s\"  # not set: 3 x deadline",
            &format!(
                "# max_in_flight = {}  # not set: host.max_in_flight",
                host.max_in_flight
            ),
            "# exclusive_by: not set  # default",
            "# partitions = 16  # not set: default",
            "# token = (value not shown)",
        ] {
            assert!(shown.contains(want), "`{want}` in\n{shown}");
        }
        for rust in ["SubjectToken", "None", "Some(", "Limits {", "s3cret"] {
            assert!(!shown.contains(rust), "`{rust}` in\n{shown}");
        }
        // The shown TOML (comments aside) reads back as the same route.
        let back: toml::Table = toml::from_str(&shown).unwrap();
        let back: RouteConfig = back["routes"].as_array().unwrap()[0]
            .clone()
            .try_into()
            .unwrap();
        assert_eq!(back.key, r.key);
        assert_eq!(back.limits, r.limits);
        assert_eq!(back.concurrency, r.concurrency);
    }

    #[test]
    fn odd_guest_config_keys_are_quoted() {
        let r = route("[config]\n\"<script>x</script>\" = \"v\"");
        let shown = text(&lines(&r, &HostConfig::default()));
        assert!(
            shown.contains("# \"<script>x</script>\" = (value not shown)"),
            "{shown}"
        );
    }
}
