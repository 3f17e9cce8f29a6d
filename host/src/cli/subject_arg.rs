//! Subject arguments of the command line (`tail SUBJECT`, `publish --subject`, `invoke
//! --subject`): checked as clap parses them, with one rule set (the config's, in
//! [`crate::subject`]), so a mistyped wildcard is an error naming the argument and the fix
//! (exit 2) instead of a command that waits for nothing. `publish` also refuses the server's
//! and the hosts' own namespaces (`$JS.`, `$KV.`, `$SYS.`, `_INBOX.`, `dedup.control.`, ...):
//! a message there is an API call or a forged host record, never an event.

use crate::subject;

/// Parses a subject filter (`*` one token, `>` the rest): what `tail` follows.
pub(crate) fn filter(s: &str) -> Result<String, String> {
    if subject::is_valid_filter(s) {
        return Ok(s.to_string());
    }
    Err(format!("{}{}", subject::filter_error(s), suggestion(s)))
}

/// Parses one literal subject (no wildcard): what `publish` and `invoke` send a message on.
pub(crate) fn literal(s: &str) -> Result<String, String> {
    if !subject::is_valid_filter(s) {
        return Err(format!("{}{}", subject::subject_error(s), suggestion(s)));
    }
    if s.contains(['*', '>']) {
        return Err(format!(
            "`{s}` is a subject filter, not one subject: a message is published on one subject; name it in full (e.g. `{}`)",
            example(s)
        ));
    }
    Ok(s.to_string())
}

/// Parses the subject `publish` sends an event on: one literal subject, outside every
/// reserved namespace ([`crate::subject::RESERVED_PREFIXES`]).
pub(crate) fn publishable(s: &str) -> Result<String, String> {
    let s = literal(s)?;
    match subject::reserved_prefix(&s) {
        Some(prefix) => Err(format!(
            "`{s}` is in `{prefix}`, {}: `publish` sends events for a stream to store, never there; name a subject your source stream captures (`[source] subjects`)",
            namespace(prefix)
        )),
        None => Ok(s),
    }
}

/// What a reserved namespace is, for an error message.
fn namespace(prefix: &str) -> &'static str {
    match prefix {
        "$JS." => "JetStream's API (a message there would act on streams and consumers)",
        "$KV." => "the key-value buckets' records (claims live there)",
        "$O." => "the object stores' chunks (components live there)",
        "$SYS." => "the system account's events and requests",
        "$NRG." => "the servers' Raft traffic",
        "_INBOX." => "the reply inboxes of requests in flight",
        _ => "where hosts take orders and keep their own records",
    }
}

/// What to write instead of a token that mixes a wildcard with text (`C-*`), if any.
fn suggestion(s: &str) -> String {
    let tokens: Vec<&str> = s.split('.').collect();
    let mixed = tokens.iter().any(|t| t.len() > 1 && t.contains(['*', '>']));
    if !mixed
        || tokens
            .iter()
            .any(|t| t.is_empty() || t.contains(char::is_whitespace))
    {
        return String::new();
    }
    let last = tokens.len() - 1;
    let fixed: Vec<&str> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| match *t {
            t if t.len() > 1 && t.contains('>') && i == last => ">",
            t if t.len() > 1 && t.contains(['*', '>']) => "*",
            t => t,
        })
        .collect();
    format!(
        "; NATS has no partial-token wildcard: write `{}` (then filter further yourself)",
        fixed.join(".")
    )
}

/// `s` with every wildcard token replaced by an example token.
fn example(s: &str) -> String {
    s.split('.')
        .map(|t| if t == "*" || t == ">" { "x" } else { t })
        .collect::<Vec<_>>()
        .join(".")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partial_token_wildcard_is_refused_with_the_whole_token_form() {
        let e = filter("shop.confirmations.C-*").unwrap_err();
        assert!(e.contains("`shop.confirmations.C-*`"), "{e}");
        assert!(e.contains("write `shop.confirmations.*`"), "{e}");
        let e = filter("a.b>").unwrap_err();
        assert!(e.contains("write `a.>`"), "{e}");
        assert_eq!(filter("mk.>").unwrap(), "mk.>");
        assert_eq!(filter("a.*.c").unwrap(), "a.*.c");
        assert!(filter("a..b").unwrap_err().contains("empty"));
        assert!(filter("").is_err());
    }

    #[test]
    fn a_literal_subject_has_no_wildcard() {
        assert_eq!(literal("orders.new").unwrap(), "orders.new");
        let e = literal("orders.*").unwrap_err();
        assert!(
            e.contains("not one subject") && e.contains("`orders.x`"),
            "{e}"
        );
        assert!(literal("orders.C-*")
            .unwrap_err()
            .contains("write `orders.*`"));
        let e = literal("orders new").unwrap_err();
        assert!(
            e.contains("`orders new` is not a valid subject: subjects have no spaces"),
            "{e}"
        );
        assert!(!literal("orders..new").unwrap_err().contains("filter"));
    }

    #[test]
    fn publish_refuses_the_servers_and_the_hosts_namespaces_by_name() {
        for (subject, prefix, what) in [
            ("$JS.API.STREAM.DELETE.EVENTS", "$JS.", "JetStream's API"),
            ("$KV.dedup-claims.k", "$KV.", "key-value"),
            ("$SYS.REQ.SERVER.PING", "$SYS.", "system account"),
            ("_INBOX.abc", "_INBOX.", "reply inboxes"),
            ("$js.api.info", "$JS.", "JetStream's API"),
            (
                "dedup.control.reload.EVENTS",
                "dedup.control.",
                "take orders",
            ),
        ] {
            let e = publishable(subject).unwrap_err();
            assert!(e.contains(&format!("`{subject}` is in `{prefix}`")), "{e}");
            assert!(e.contains(what) && e.contains("[source] subjects"), "{e}");
        }
        assert_eq!(publishable("orders.new").unwrap(), "orders.new");
        assert!(publishable("$JS.*")
            .unwrap_err()
            .contains("not one subject"));
    }
}
