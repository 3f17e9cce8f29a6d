//! Durations as config files write them (`"30s"`, `"500ms"`, `"1h 30m"`), with an error that
//! shows how to write one: `#[serde(with = "crate::durations")]`, or
//! `crate::durations::option` for an optional one and `crate::durations::list` for a list.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

/// The JSON Schema of a duration field: humantime text. Fields name it with
/// `#[schemars(with = "crate::durations::Text")]`.
pub struct Text;

impl schemars::JsonSchema for Text {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "description": "A duration: a number and a unit, e.g. \"500ms\", \"30s\", \"5m\", \"1h 30m\".",
            "pattern": "^\\s*(0|([0-9]+(\\.[0-9]+)?\\s*(nanos|nsec|ns|usec|us|µs|millis|msec|ms|seconds|second|secs|sec|s|minutes|minute|mins|min|m|hours|hour|hrs|hr|h|days|day|d|weeks|week|wks|wk|w|months|month|M|years|year|yrs|yr|y)\\s*)+)$"
        })
    }
}

/// Parses one duration; the error names the text and shows examples.
pub fn parse(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| {
        format!(
            "`{text}` is not a duration ({e}); write e.g. \"500ms\", \"30s\", \"5m\" or \"1h 30m\""
        )
    })
}

/// Writes a duration as humantime text.
pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    humantime_serde::serialize(d, s)
}

/// Reads a duration from humantime text.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    parse(&text).map_err(serde::de::Error::custom)
}

/// An optional duration.
pub mod option {
    use super::*;

    /// Writes an optional duration as humantime text.
    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        humantime_serde::option::serialize(d, s)
    }

    /// Reads an optional duration from humantime text.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let text = Option::<String>::deserialize(d)?;
        text.map(|t| parse(&t).map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// A list of durations (`["1s", "500ms"]`).
pub mod list {
    use super::*;

    /// Writes a list of durations as humantime texts.
    pub fn serialize<S: Serializer>(d: &[Duration], s: S) -> Result<S::Ok, S::Error> {
        let texts: Vec<String> = d
            .iter()
            .map(|d| humantime::format_duration(*d).to_string())
            .collect();
        serde::Serialize::serialize(&texts, s)
    }

    /// Reads a list of durations from humantime texts.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Duration>, D::Error> {
        let texts: Vec<String> = Vec::deserialize(d)?;
        texts
            .iter()
            .map(|t| parse(t).map_err(serde::de::Error::custom))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_bad_duration_shows_how_to_write_one() {
        assert_eq!(super::parse("5m"), Ok(std::time::Duration::from_secs(300)));
        let err = super::parse("soon").unwrap_err();
        assert!(
            err.contains("`soon` is not a duration") && err.contains("\"30s\""),
            "{err}"
        );
    }
}
