//! Secrets in the URLs of outbound calls, masked where people read them (`inspect`, the
//! console's key story, a dead letter's reason, logs and spans): the credentials of a URL's
//! userinfo; the values of query (or fragment) parameters whose names say they are secret
//! (`api_key`, `token`, `signature`, …); and, whatever their names, values and path segments
//! that look like generated secrets: a chat bot's token in its path (`/bot<id>:<token>/`), the
//! segment after one named like a secret (`/token/<t>`), and long mixed-case alphanumeric
//! strings with digits (a webhook's `/services/T…/B…/<secret>`, `sk_live_…`). The journal
//! keeps the exact request: a re-run is compared with it byte for byte
//! ([`crate::journal::decide`]); only the text shown is masked. Masking is a best effort for
//! display, not access control: whoever may read the journal reads the exact request.

/// What a masked secret reads as.
pub const MASK: &str = "***";

/// Parameter names (or `_`/`-`/`.`-separated words of them) that are secrets.
const SECRET_WORDS: &[&str] = &[
    "key",
    "apikey",
    "sig",
    "signature",
    "token",
    "secret",
    "password",
    "passwd",
    "pwd",
    "pass",
    "auth",
    "authorization",
    "credential",
    "credentials",
    "jwt",
    "session",
    "sid",
];

/// Parts of a parameter name that make it secret wherever they appear in it (`accessToken`,
/// `X-Amz-Security-Token`, `client_secret`).
const SECRET_PARTS: &[&str] = &[
    "token",
    "secret",
    "passw",
    "apikey",
    "signature",
    "credential",
];

/// The shortest value that can pass for a generated secret by its look alone.
const GENERATED_MIN_LEN: usize = 20;

/// `url` with the credentials of its userinfo, the values of its secret parameters and its
/// secret-looking path segments replaced by [`MASK`]; text that is no URL is returned as it
/// is (an idempotency key made of a message's key, say), but for its `?` parameters.
pub fn mask_url(url: &str) -> String {
    let (rest, fragment) = match url.split_once('#') {
        Some((rest, fragment)) => (rest, Some(fragment)),
        None => (url, None),
    };
    let (base, query) = match rest.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (rest, None),
    };
    let mut out = mask_path(&mask_userinfo(base));
    if let Some(query) = query {
        out.push('?');
        out.push_str(&mask_parameters(query));
    }
    if let Some(fragment) = fragment {
        out.push('#');
        out.push_str(&mask_parameters(fragment));
    }
    out
}

/// `scheme://user:password@host/path` as `scheme://***@host/path`.
fn mask_userinfo(base: &str) -> String {
    let Some(scheme_end) = base.find("://") else {
        return base.to_string();
    };
    let after = &base[scheme_end + 3..];
    let authority_end = after.find('/').unwrap_or(after.len());
    let authority = &after[..authority_end];
    match authority.rfind('@') {
        Some(at) => format!(
            "{}://{MASK}@{}{}",
            &base[..scheme_end],
            &authority[at + 1..],
            &after[authority_end..]
        ),
        None => base.to_string(),
    }
}

/// The path of URL `base` (after its authority) with secret-looking segments masked: one
/// after a segment named like a secret (`/token/<t>`), a bot token (`bot<id>:<token>`), and
/// generated-looking strings ([`looks_generated`]).
fn mask_path(base: &str) -> String {
    let Some(scheme_end) = base.find("://") else {
        return base.to_string();
    };
    let after = &base[scheme_end + 3..];
    let Some(path_start) = after.find('/') else {
        return base.to_string();
    };
    let (head, path) = base.split_at(scheme_end + 3 + path_start);
    let mut after_secret_name = false;
    let segments: Vec<String> = path
        .split('/')
        .map(|segment| {
            let secret = !segment.is_empty()
                && (after_secret_name || is_bot_token(segment) || looks_generated(segment));
            after_secret_name = is_secret(segment);
            match secret {
                true => MASK.to_string(),
                false => segment.to_string(),
            }
        })
        .collect();
    format!("{head}{}", segments.join("/"))
}

/// A chat bot's token as its API puts it in the path: `bot<digits>:<token>`.
fn is_bot_token(segment: &str) -> bool {
    segment
        .strip_prefix("bot")
        .and_then(|rest| rest.split_once(':'))
        .is_some_and(|(id, token)| {
            !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()) && !token.is_empty()
        })
}

/// Whether `text` looks like a generated secret whatever it is called: at least
/// [`GENERATED_MIN_LEN`] characters of letters, digits, `-` and `_`, with digits and both
/// upper- and lower-case letters (so neither a word, a slug, a lower-case UUID nor a hex
/// digest), or a well-known secret key prefix (`sk_`, `rk_`, `ghp_`, `xox…-`).
fn looks_generated(text: &str) -> bool {
    let text = percent_decoded(text);
    let well_known = [
        "sk_",
        "rk_",
        "ghp_",
        "gho_",
        "github_pat_",
        "xoxb-",
        "xoxp-",
        "xapp-",
    ]
    .iter()
    .any(|prefix| text.starts_with(prefix) && text.len() > prefix.len() + 8);
    let charset = text
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    let mixed = text.bytes().any(|b| b.is_ascii_digit())
        && text.bytes().any(|b| b.is_ascii_uppercase())
        && text.bytes().any(|b| b.is_ascii_lowercase());
    well_known || (charset && mixed && text.len() >= GENERATED_MIN_LEN)
}

/// `a=1&token=x;sig=y&Zq3…` as `a=1&token=***;sig=***&***`: `&` and `;` both separate
/// parameters, and a value (or a bare parameter) that looks generated is masked whatever
/// its name.
fn mask_parameters(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut start = 0;
    for end in text
        .match_indices(['&', ';'])
        .map(|(at, _)| at)
        .chain([text.len()])
    {
        let pair = &text[start..end];
        match pair.split_once('=') {
            Some((name, value))
                if !value.is_empty() && (is_secret(name) || looks_generated(value)) =>
            {
                out.push_str(name);
                out.push('=');
                out.push_str(MASK);
            }
            None if looks_generated(pair) => out.push_str(MASK),
            _ => out.push_str(pair),
        }
        // The separator that ended this pair, as it was.
        out.push_str(&text[end..(end + 1).min(text.len())]);
        start = end + 1;
    }
    out
}

/// Whether parameter `name` (percent-encoded as in the URL) names a secret.
fn is_secret(name: &str) -> bool {
    let name = percent_decoded(name).to_ascii_lowercase();
    SECRET_PARTS.iter().any(|part| name.contains(part))
        || name
            .split(['_', '-', '.', '[', ']'])
            .any(|word| SECRET_WORDS.contains(&word))
}

/// `%XX` escapes decoded (others kept as they are), lossily: for the name's check only.
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_in_the_userinfo_are_masked() {
        assert_eq!(
            mask_url("https://alice:s3cret@api.example.com/v1/pay"),
            "https://***@api.example.com/v1/pay"
        );
        assert_eq!(
            mask_url("https://sk_live_123@api.example.com"),
            "https://***@api.example.com"
        );
        // An `@` in the path is no userinfo.
        assert_eq!(
            mask_url("https://h.example/users/@bob"),
            "https://h.example/users/@bob"
        );
    }

    #[test]
    fn secret_parameter_values_are_masked_and_others_kept() {
        assert_eq!(
            mask_url("https://h/x?api_key=abc&id=7&token=t1&sig=zz&Signature=Q&ms=3000"),
            "https://h/x?api_key=***&id=7&token=***&sig=***&Signature=***&ms=3000"
        );
        assert_eq!(
            mask_url(
                "https://s3/b/o?X-Amz-Credential=AK%2F1&X-Amz-Security-Token=T&X-Amz-Expires=60"
            ),
            "https://s3/b/o?X-Amz-Credential=***&X-Amz-Security-Token=***&X-Amz-Expires=60"
        );
        assert_eq!(
            mask_url("https://h/cb?accessToken=a&client_secret=c&password=p&key=k&hockey=1"),
            "https://h/cb?accessToken=***&client_secret=***&password=***&key=***&hockey=1"
        );
        assert_eq!(
            mask_url("https://h/x?api%5Fkey=v&empty_token="),
            "https://h/x?api%5Fkey=***&empty_token="
        );
        assert_eq!(
            mask_url("https://u:p@h/cb?a=1#access_token=t&state=s"),
            "https://***@h/cb?a=1#access_token=***&state=s"
        );
    }

    #[test]
    fn secrets_in_paths_and_bare_values_are_masked() {
        // A chat webhook's secret is its last path segment.
        assert_eq!(
            mask_url(
                "https://hooks.slack.example/services/T0A1B2C3D/B0E4F5G6H/Xq7Lm2Pz9Rt4Kw8Nb3Vc6Yd1"
            ),
            "https://hooks.slack.example/services/T0A1B2C3D/B0E4F5G6H/***"
        );
        // A bot's token in its path.
        assert_eq!(
            mask_url("https://api.telegram.example/bot123456:AAHdqTcvCH1vGWJxfSeofSAs/sendMessage"),
            "https://api.telegram.example/***/sendMessage"
        );
        // The segment after one named like a secret.
        assert_eq!(
            mask_url("https://h.example/v1/token/abc/refresh"),
            "https://h.example/v1/token/***/refresh"
        );
        // `;` separates parameters too, and a generated value is masked whatever its name.
        assert_eq!(
            mask_url("https://h/x?a=1;token=t&x=sk_live_51HxYz0123&sk_test_abcdefghij;b=2"),
            "https://h/x?a=1;token=***&x=***&***;b=2"
        );
        assert_eq!(
            mask_url("https://h/x?Zq3Lm2Pz9Rt4Kw8Nb3Vc6Yd1"),
            "https://h/x?***"
        );
    }

    #[test]
    fn ordinary_paths_and_values_are_kept() {
        for text in [
            "https://h.example/orders/3fa85f64-5717-4562-b3fc-2c963f66afa6/items",
            "https://h.example/blobs/9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
            "https://api.example.com/v1/chat/completions?model=gpt-4o-mini&stream=false",
            "https://h.example/bot/help?q=botanic:garden",
            "https://h.example/a;b/c?x=1;y=2&z",
        ] {
            assert_eq!(mask_url(text), text);
        }
    }

    #[test]
    fn text_without_secrets_is_unchanged() {
        for text in [
            "http://127.0.0.1:9/hooks/a",
            "http://127.0.0.1:9/slow?ms=3000",
            "http.k.k1.call.0",
            "",
        ] {
            assert_eq!(mask_url(text), text);
        }
    }
}
