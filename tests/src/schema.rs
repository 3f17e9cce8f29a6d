//! Checks config text against the JSON Schema `dedup-host schema` prints: every config a test
//! writes, and every config in the repository, must be one an editor using the schema accepts
//! whenever the host's own parser accepts it.

use std::path::Path;
use std::sync::OnceLock;

use dedup_host::config::Config;

/// The schema's validator, built once per process.
fn validator() -> &'static jsonschema::Validator {
    static VALIDATOR: OnceLock<jsonschema::Validator> = OnceLock::new();
    VALIDATOR.get_or_init(|| {
        jsonschema::draft202012::new(&dedup_host::config::schema::schema())
            .expect("the config schema is a valid JSON Schema")
    })
}

/// What the schema says of a config text: each error with its place, or nothing.
pub fn errors(text: &str) -> Vec<String> {
    let table: toml::Table = match toml::from_str(text) {
        Ok(table) => table,
        Err(e) => return vec![format!("not TOML: {e}")],
    };
    let value = serde_json::to_value(table).expect("TOML converts to JSON");
    validator()
        .iter_errors(&value)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

/// Panics when the parser accepts `text` (paths relative to `dir`) and the schema refuses it (the schema cannot say
/// every rule the parser checks, such as a lease longer than three heartbeats, so the other
/// way round is not asked).
pub fn agrees_with_the_parser(text: &str, dir: &Path) {
    if Config::parse(text, Path::new("test.toml"), dir.to_path_buf()).is_ok() {
        let errors = errors(text);
        assert!(
            errors.is_empty(),
            "the host accepts this config but its JSON Schema refuses it: {errors:?}\n{text}"
        );
    }
}
