//! Example handler: republishes the payload upper-cased on `<subject>.done`.

wit_bindgen::generate!({
    path: "../../../wit",
    world: "handler-guest",
});

use exports::dedup::handler::handler::Guest;
use dedup::handler::log::{log, Level};
use dedup::handler::types::{Event, Failure, Output};

struct Uppercase;

impl Guest for Uppercase {
    fn handle(event: Event) -> Result<Vec<Output>, Failure> {
        log(
            Level::Debug,
            "upper-casing payload",
            &[("bytes".to_string(), event.payload.len().to_string())],
        );
        Ok(vec![Output {
            subject: format!("{}.done", event.subject),
            payload: event.payload.to_ascii_uppercase(),
            headers: Vec::new(),
        }])
    }
}

export!(Uppercase);
