//! Guest-supplied text on its way into the host's logs, claim records and headers: bounded in
//! size and with control characters escaped, so a guest can neither flood a record nor forge a
//! log line with an embedded newline.

/// The most bytes of a guest's retry or reject reason that are kept.
pub const MAX_REASON_BYTES: usize = 1024;

/// The most characters of a header value the host writes from guest or message text.
const MAX_HEADER_CHARS: usize = 1024;

/// `s` with every control character written as an escape (`\n`, `\u{1b}`), so it stays on
/// one line and cannot carry terminal escapes.
pub fn escape_controls(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_string();
    }
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// A guest's reason as the host stores and logs it: one line, at most [`MAX_REASON_BYTES`]
/// plus a note of the full size when cut.
pub fn reason(s: &str) -> String {
    let escaped = escape_controls(prefix(s, MAX_REASON_BYTES));
    if escaped.len() <= MAX_REASON_BYTES && s.len() <= MAX_REASON_BYTES {
        return escaped;
    }
    format!(
        "{}… ({} bytes in all)",
        prefix(&escaped, MAX_REASON_BYTES),
        s.len()
    )
}

/// The longest prefix of `s` of at most `max` bytes that ends at a character boundary.
fn prefix(s: &str, max: usize) -> &str {
    let mut end = max.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Text as a header value: one line, escaped, at most 1,024 characters.
pub fn header_value(s: &str) -> String {
    escape_controls(s).chars().take(MAX_HEADER_CHARS).collect()
}

/// An error and its causes joined by `: `, leaving out a cause whose text the message before
/// it already contains (many errors repeat their source in their own text).
pub fn error_chain(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let cause = cause.to_string();
        if text.contains(&cause) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&cause);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_the_message_repeats_is_shown_once() {
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let e = anyhow::Error::new(io).context("IO error: connection refused");
        let e = e.context("cannot connect to NATS at `nats://127.0.0.1:1`");
        assert_eq!(
            error_chain(&e),
            "cannot connect to NATS at `nats://127.0.0.1:1`: IO error: connection refused"
        );
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(escape_controls("a\nINFO forged"), "a\\nINFO forged");
        assert_eq!(escape_controls("\u{1b}[31m"), "\\u{1b}[31m");
        assert_eq!(escape_controls("plain"), "plain");
    }

    #[test]
    fn reasons_are_bounded() {
        let long = "é".repeat(10_000);
        let r = reason(&long);
        assert!(r.len() < MAX_REASON_BYTES + 64, "{}", r.len());
        assert!(r.ends_with("(20000 bytes in all)"));
        assert_eq!(reason("short"), "short");
        let lines = reason(&"r\n".repeat(25_000));
        assert!(
            lines.len() < MAX_REASON_BYTES + 64 && !lines.contains('\n'),
            "{lines}"
        );
    }

    #[test]
    fn header_values_are_single_lines() {
        let v = header_value(&"x\r\n".repeat(2000));
        assert!(!v.contains(['\r', '\n']));
        assert_eq!(v.chars().count(), 1024);
    }
}
