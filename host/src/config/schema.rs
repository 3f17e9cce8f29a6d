//! The JSON Schema of a host config file (`dedup-host schema`): made from the config structs
//! and their doc comments, so it cannot drift from what [`Config::parse`] accepts. Editors
//! (Taplo, Even Better TOML) check a `host.toml` against it as it is typed; the book's
//! configuration reference is generated from it too.

use schemars::generate::SchemaSettings;
use serde_json::{Map, Value};

use super::Config;

/// The schema of a whole config file, as JSON Schema draft 2020-12.
///
/// Every field carries its description (its doc comment) and its default; a field whose
/// default depends on other settings or on the machine carries `x-default-text` instead,
/// saying what the default is in words. Unknown keys are refused (`additionalProperties:
/// false`), as the parser refuses them.
pub fn schema() -> Value {
    let generator = SchemaSettings::draft2020_12().into_generator();
    let schema = generator.into_root_schema_for::<Config>();
    let mut value = schema.to_value();
    if let Value::Object(root) = &mut value {
        root.insert(
            "title".into(),
            Value::String("dedup-host config (host.toml)".into()),
        );
    }
    tidy(&mut value);
    value
}

/// Drops what helps no reader: a section's default (its whole default table, repeated field by
/// field inside it), a default the words of `x-default-text` replace, and a `null` default
/// (TOML has no null: such a key is simply left out).
fn tidy(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if map.contains_key("x-default-text")
                || is_section(map)
                || map.get("default") == Some(&Value::Null)
            {
                map.remove("default");
            }
            map.values_mut().for_each(tidy);
        }
        Value::Array(items) => items.iter_mut().for_each(tidy),
        _ => {}
    }
}

/// Whether a property's schema is a table of its own (a `$ref` to a section's definition).
fn is_section(map: &Map<String, Value>) -> bool {
    map.get("default")
        .and_then(Value::as_object)
        .is_some_and(|table| !table.is_empty())
        || map
            .get("default")
            .and_then(Value::as_array)
            .is_some_and(|items| items.iter().any(Value::is_object))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_refuses_unknown_keys_and_describes_every_field() {
        let schema = schema();
        assert_eq!(schema["additionalProperties"], Value::Bool(false));
        let host = &schema["$defs"]["HostConfig"];
        assert_eq!(host["additionalProperties"], Value::Bool(false));
        let concurrency = &host["properties"]["concurrency"];
        assert_eq!(concurrency["default"], serde_json::json!(64));
        assert!(concurrency["description"]
            .as_str()
            .is_some_and(|d| d.contains("Guests of one route")));
        assert!(schema["properties"]["host"].get("default").is_none());
    }
}
