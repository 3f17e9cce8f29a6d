//! Sizes in bytes as config files write them: a number (`67108864`) or a string with a unit
//! (`"64MiB"`, `"8 MB"`, `"512KiB"`, `"1GiB"`).

use std::fmt;

use serde::de::{self, Deserializer, Visitor};

/// What a size error shows as examples.
const EXAMPLES: &str =
    "a number of bytes or a string with a unit, e.g. 67108864, \"64MiB\", \"8MB\" or \"512KiB\"";

/// The JSON Schema of a size field: a number of bytes or a string with a unit. Fields name it
/// with `#[schemars(with = "crate::size::Text")]`.
pub struct Text;

impl schemars::JsonSchema for Text {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Size".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A size in bytes: a number (67108864) or a string with a unit (\"64MiB\", \"8MB\", \"512KiB\", \"1GiB\").",
            "anyOf": [
                { "type": "integer", "minimum": 0 },
                { "type": "string", "pattern": "^\\s*[0-9][0-9_]*\\s*([bB]|[kKmMgG]([iI]?[bB])?)?\\s*$" }
            ]
        })
    }
}

/// Parses `"64MiB"`-style text: digits (with `_` allowed), optional spaces, then an optional
/// unit `B`, `KB`/`KiB`, `MB`/`MiB`, `GB`/`GiB` (case-insensitive; `K`, `M`, `G` alone are
/// binary).
pub fn parse(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '_')
        .unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let digits: String = digits.chars().filter(|c| *c != '_').collect();
    let number: u64 = digits
        .parse()
        .map_err(|_| format!("`{text}` is not a size: expected {EXAMPLES}"))?;
    let factor: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "k" | "kib" => 1 << 10,
        "mb" => 1_000_000,
        "m" | "mib" => 1 << 20,
        "gb" => 1_000_000_000,
        "g" | "gib" => 1 << 30,
        other => {
            return Err(format!(
                "`{text}`: unknown unit `{other}`; expected {EXAMPLES}"
            ))
        }
    };
    number
        .checked_mul(factor)
        .ok_or_else(|| format!("`{text}` is too large"))
}

/// Deserializes a size into any unsigned integer type: `#[serde(deserialize_with =
/// "crate::size::deserialize")]`.
pub fn deserialize<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<u64>,
{
    struct Size;
    impl Visitor<'_> for Size {
        type Value = u64;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str(EXAMPLES)
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
            Ok(v)
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
            u64::try_from(v).map_err(|_| E::custom(format!("{v} is negative; expected {EXAMPLES}")))
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
            parse(v).map_err(E::custom)
        }
    }
    let bytes = deserializer.deserialize_any(Size)?;
    T::try_from(bytes).map_err(|_| de::Error::custom(format!("{bytes} bytes is too large here")))
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn sizes_take_units() {
        assert_eq!(parse("64MiB"), Ok(64 << 20));
        assert_eq!(parse("8 MB"), Ok(8_000_000));
        assert_eq!(parse("512kib"), Ok(512 << 10));
        assert_eq!(parse("100_000"), Ok(100_000));
        assert_eq!(parse("1G"), Ok(1 << 30));
        let err = parse("64 megs").unwrap_err();
        assert!(
            err.contains("unknown unit `megs`") && err.contains("\"64MiB\""),
            "{err}"
        );
        assert!(parse("lots").unwrap_err().contains("e.g. 67108864"));
    }
}
