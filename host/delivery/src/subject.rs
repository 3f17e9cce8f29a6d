//! NATS subject filters: validity and matching (`*` one token, `>` the rest).

/// Whether `subject` is a valid filter: non-empty tokens, no whitespace, `>` only last.
pub fn is_valid_filter(filter: &str) -> bool {
    let tokens: Vec<&str> = filter.split('.').collect();
    !filter.is_empty()
        && tokens.iter().enumerate().all(|(i, t)| {
            !t.is_empty()
                && !t.contains(char::is_whitespace)
                && (*t != ">" || i == tokens.len() - 1)
                && (t.len() == 1 || !t.contains(['*', '>']))
                && *t != "#"
        })
}

/// Why `filter` is not a valid filter, for an error message: what is wrong and what to write.
pub fn filter_error(filter: &str) -> String {
    format!(
        "`{filter}` is not a valid subject filter: {}",
        invalid_because(filter)
    )
}

/// Why `subject`, meant as one subject (`publish`, `invoke`), is not a valid one, in words.
pub fn subject_error(subject: &str) -> String {
    format!(
        "`{subject}` is not a valid subject: {}",
        invalid_because(subject)
    )
}

/// What is wrong with an invalid subject or filter.
fn invalid_because(filter: &str) -> &'static str {
    if filter.split('.').any(|t| t == "#") {
        "`#` is MQTT's wildcard; in NATS `>` matches the rest of a subject and `*` one token"
    } else if filter.contains(char::is_whitespace) {
        "subjects have no spaces"
    } else if filter.split('.').any(str::is_empty) {
        "a token is empty (two dots, or a dot at an end)"
    } else {
        "`*` (one token) and `>` (the rest, last only) must stand alone between dots"
    }
}

/// Subject prefixes of the server's own APIs and internals (JetStream, KV, object store,
/// system account, Raft groups, reply inboxes). No guest output may ever land there.
pub const RESERVED_PREFIXES: [&str; 11] = [
    "$JS.",
    "$KV.",
    "$O.",
    "$SYS.",
    "$NRG.",
    "_INBOX.",
    CONTROL_PREFIX,
    EXCLUSIVE_PREFIX,
    FENCED_CLAIMS_PREFIX,
    FEED_PREFIX,
    ACTIVITY_PREFIX,
];

/// Where hosts take orders (`dedup-host reload`): never reachable by a guest.
pub const CONTROL_PREFIX: &str = "dedup.control.";

/// Whether a control request's reply subject is a request inbox (`_INBOX.`, what every
/// NATS client's requests use). A host answers only there: an answer goes out with the
/// host's own permissions, so a reply subject chosen by whoever may publish on the control
/// subjects (`$KV.<claims bucket>.<key>`, say) would write there as the host.
pub fn is_request_inbox(reply: &str) -> bool {
    reply.starts_with("_INBOX.") && reply.len() > "_INBOX.".len() && !reply.contains(['*', '>'])
}

/// Where exclusive routes queue their messages per entity (`crate::exclusive`): only the
/// host writes there.
pub const EXCLUSIVE_PREFIX: &str = "dedup.exclusive.";

/// Where fenced output streams hold claim records (`crate::fenced`): a guest output there
/// would forge one.
pub const FENCED_CLAIMS_PREFIX: &str = "_dedup.claims.";

/// Where hosts publish their counters for the console (`crate::feed`): a guest output there
/// would forge them.
pub const FEED_PREFIX: &str = "_dedup.feed.";

/// Where changes are recorded (`crate::activity`): a guest output there would forge an entry.
pub const ACTIVITY_PREFIX: &str = "_dedup.activity.";

/// The subject every host of a deployment listens on for `dedup-host reload`:
/// `dedup.control.reload.<source stream>.<deployment>` for a deployment with a set name
/// (`named`), so another deployment on the same stream neither reaches its hosts nor needs the
/// right to; `dedup.control.reload.<source stream>` otherwise (a default name follows the
/// routes' subjects, which a reload changes, so it cannot name the subject hosts subscribed to
/// at start).
///
/// A name is free text (names set before the reload subject carried them keep working): one
/// made of letters, digits, `_` and `-` is the last token as it is; any other is written as
/// `x` and its UTF-8 bytes in hex, one token that no other name maps to.
pub fn reload_subject(source_stream: &str, named: Option<&str>) -> String {
    match named {
        Some(name) => format!(
            "{CONTROL_PREFIX}reload.{source_stream}.{}",
            name_token(name)
        ),
        None => format!("{CONTROL_PREFIX}reload.{source_stream}"),
    }
}

/// `name` as one subject token (see [`reload_subject`]): itself when it is letters, digits,
/// `_` and `-` and does not start with `x`, else `x` and its bytes in hex.
pub fn name_token(name: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if !name.is_empty() && !name.starts_with('x') && name.chars().all(plain) {
        return name.to_string();
    }
    let hex: String = name.bytes().map(|b| format!("{b:02x}")).collect();
    format!("x{hex}")
}

/// The reserved prefix `subject` starts with (case-insensitively), if any.
pub fn reserved_prefix(subject: &str) -> Option<&'static str> {
    RESERVED_PREFIXES.iter().copied().find(|p| {
        subject
            .get(..p.len())
            .is_some_and(|head| head.eq_ignore_ascii_case(p))
            || subject.eq_ignore_ascii_case(&p[..p.len() - 1])
    })
}

/// Whether some subject in a reserved namespace matches `filter` (`>` and `$JS.>` do).
pub fn reaches_reserved(filter: &str) -> bool {
    reserved_prefix(filter).is_some()
        || RESERVED_PREFIXES
            .iter()
            .any(|p| overlaps(filter, &format!("{}>", p)))
}

/// Why `subject` cannot be published to, if it cannot: empty, empty tokens, whitespace or
/// control characters, wildcards.
pub fn literal_problem(subject: &str) -> Option<&'static str> {
    if subject.is_empty() {
        return Some("is empty");
    }
    if subject.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Some("contains whitespace or control characters");
    }
    if subject.split('.').any(str::is_empty) {
        return Some("has an empty token");
    }
    if subject.split('.').any(|t| t == "*" || t == ">") {
        return Some("contains a wildcard (`*` or `>`); outputs need a literal subject");
    }
    None
}

/// Whether a concrete subject matches a filter.
pub fn matches(filter: &str, subject: &str) -> bool {
    let mut subject_tokens = subject.split('.');
    for f in filter.split('.') {
        match (f, subject_tokens.next()) {
            (">", Some(_)) => return true,
            ("*", Some(_)) => {}
            (f, Some(s)) if f == s => {}
            _ => return false,
        }
    }
    subject_tokens.next().is_none()
}

/// Whether every subject matched by `inner` is also matched by `outer`.
pub fn covers(outer: &str, inner: &str) -> bool {
    let mut inner_tokens = inner.split('.');
    for o in outer.split('.') {
        match (o, inner_tokens.next()) {
            (">", Some(_)) => return true,
            ("*", Some(i)) if i != ">" => {}
            (o, Some(i)) if o == i => {}
            _ => return false,
        }
    }
    inner_tokens.next().is_none()
}

/// Whether some subject is matched by both filters.
pub fn overlaps(a: &str, b: &str) -> bool {
    let (mut at, mut bt) = (a.split('.'), b.split('.'));
    loop {
        match (at.next(), bt.next()) {
            (None, None) => return true,
            (Some(">"), Some(_)) | (Some(_), Some(">")) => return true,
            (Some(x), Some(y)) if x == "*" || y == "*" || x == y => {}
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_answer_control_requests_only_on_request_inboxes() {
        assert!(is_request_inbox("_INBOX.abc.def"));
        for hostile in [
            "$KV.claims.r.k.x",
            "$JS.API.STREAM.DELETE.EVENTS",
            "_INBOX.",
            "_INBOX.>",
            "dedup.control.x",
            "other",
        ] {
            assert!(!is_request_inbox(hostile), "{hostile}");
        }
    }

    #[test]
    fn matching_follows_nats_wildcards() {
        assert!(matches("a.*.c", "a.b.c"));
        assert!(!matches("a.*.c", "a.b.c.d"));
        assert!(matches("a.>", "a.b.c"));
        assert!(!matches("a.>", "a"));
        assert!(!matches("a.b", "a.b.c"));
    }

    #[test]
    fn covers_and_overlaps() {
        assert!(covers("a.>", "a.*.c"));
        assert!(covers("a.*", "a.b"));
        assert!(!covers("a.*", "a.>"));
        assert!(!covers("a.b", "a.*"));
        assert!(overlaps("a.*", "a.b"));
        assert!(overlaps("a.>", "*.b.c"));
        assert!(!overlaps("a.b", "a.c"));
    }

    #[test]
    fn reserved_namespaces_are_found_in_subjects_and_filters() {
        assert_eq!(reserved_prefix("$JS.API.STREAM.DELETE.X"), Some("$JS."));
        assert_eq!(reserved_prefix("$js.api.x"), Some("$JS."));
        assert_eq!(reserved_prefix("_INBOX.abc"), Some("_INBOX."));
        assert_eq!(reserved_prefix("orders.js"), None);
        // The console's feed and activity log: a guest must not forge them.
        assert_eq!(
            reserved_prefix("_dedup.feed.dedup-hosts.h1"),
            Some(FEED_PREFIX)
        );
        assert_eq!(
            reserved_prefix("_dedup.activity.dedup-hosts"),
            Some(ACTIVITY_PREFIX)
        );
        assert!(reaches_reserved("_dedup.>"));
        assert!(reaches_reserved(">"));
        assert!(reaches_reserved("$KV.>"));
        assert!(reaches_reserved("*.API.>"));
        assert!(!reaches_reserved("out.>"));
        assert!(!reaches_reserved("a.*"));
    }

    #[test]
    fn literal_subjects() {
        assert_eq!(literal_problem("a.b"), None);
        assert!(literal_problem("a.*").is_some());
        assert!(literal_problem("a.>").is_some());
        assert!(literal_problem("").is_some());
        assert!(literal_problem("a b").is_some());
        assert!(literal_problem("a..b").is_some());
        assert!(literal_problem("a\r\nPUB x").is_some());
    }

    #[test]
    fn validity() {
        assert!(!is_valid_filter("shop.orders.#"));
        assert!(filter_error("shop.orders.#").contains("in NATS `>` matches the rest"));
        assert!(is_valid_filter("a.*.>"));
        assert!(!is_valid_filter("a..b"));
        assert!(!is_valid_filter("a.>.b"));
        assert!(!is_valid_filter("a b"));
        assert!(!is_valid_filter("a*"));
        assert!(!is_valid_filter(""));
    }
}
