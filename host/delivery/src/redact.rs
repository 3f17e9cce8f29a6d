//! Secrets in the URLs of outbound calls, masked where people read them (`inspect`, the
//! console's key story, a dead letter's reason): the credentials of a URL's userinfo, and the
//! values of query (or fragment) parameters whose names say they are secret (`api_key`,
//! `token`, `signature`, …). The journal keeps the exact request: a re-run is compared with
//! it byte for byte ([`crate::journal::decide`]); only the text shown is masked.

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

/// `url` with the credentials of its userinfo and the values of its secret parameters
/// replaced by [`MASK`]; text that is no URL is returned as it is (an idempotency key made of
/// a message's key, say), but for its `?` parameters.
pub fn mask_url(url: &str) -> String {
    let (rest, fragment) = match url.split_once('#') {
        Some((rest, fragment)) => (rest, Some(fragment)),
        None => (url, None),
    };
    let (base, query) = match rest.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (rest, None),
    };
    let mut out = mask_userinfo(base);
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

/// `a=1&token=x` as `a=1&token=***`.
fn mask_parameters(text: &str) -> String {
    text.split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, value)) if !value.is_empty() && is_secret(name) => {
                format!("{name}={MASK}")
            }
            _ => pair.to_string(),
        })
        .collect::<Vec<_>>()
        .join("&")
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
