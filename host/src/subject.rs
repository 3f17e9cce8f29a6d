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
        })
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
    fn validity() {
        assert!(is_valid_filter("a.*.>"));
        assert!(!is_valid_filter("a..b"));
        assert!(!is_valid_filter("a.>.b"));
        assert!(!is_valid_filter("a b"));
        assert!(!is_valid_filter("a*"));
        assert!(!is_valid_filter(""));
    }
}
