//! The console's page frame and the helpers every page uses. Pages are built with `maud`,
//! which escapes every interpolated string, so text a producer or a guest controls
//! (payloads, headers, keys, reasons) can only ever be text; [`shown`] also makes control
//! characters visible, and [`payload`] cuts what it shows of big payloads.

use maud::{html, Markup, DOCTYPE};

use crate::claim::record::now_ms;

/// How much of a payload a page shows.
pub const SHOWN_BYTES: usize = 64 * 1024;

/// Who is looking and the CSRF value their forms carry.
#[derive(Debug, Clone, Default)]
pub struct Viewer {
    /// The logged-in name, if any.
    pub who: Option<String>,
    /// The CSRF value of the forms on the page (empty when not logged in).
    pub csrf: String,
}

/// A whole page: the navigation, a search box, then `body`.
pub fn page(title: &str, viewer: &Viewer, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · dedup-host console" }
                link rel="stylesheet" href="/assets/console.css";
                script src="/assets/console.js" defer {}
            }
            body {
                nav {
                    a.brand href="/" { "dedup-host" }
                    a href="/" { "Overview" }
                    a href="/letters" { "Dead letters" }
                    a href="/audit" { "Audit" }
                    a href="/deploys" { "Deploys" }
                    a href="/activity" { "Activity" }
                    form.search method="get" action="/keys" {
                        input type="search" name="q" placeholder="key or stream sequence" aria-label="key or stream sequence";
                        button type="submit" { "Find" }
                    }
                    span.who {
                        @match &viewer.who {
                            Some(who) => {
                                "logged in: " (who) " "
                                form.logout method="post" action="/logout" { (csrf(viewer)) button #logout type="submit" { "Log out" } }
                            }
                            None => { a href="/login" { "log in" } }
                        }
                    }
                }
                main {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

/// `text` with control characters (but newline and tab) shown as `\u{..}` escapes.
pub fn shown(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() && c != '\n' && c != '\t' {
            out.push_str(&c.escape_unicode().to_string());
        } else {
            out.push(c);
        }
    }
    out
}

/// A payload three ways: as text, as indented JSON when it parses, and as hex; each cut at
/// [`SHOWN_BYTES`] with the full size said.
pub fn payload(bytes: &[u8]) -> Markup {
    let cut = &bytes[..bytes.len().min(SHOWN_BYTES)];
    let json = serde_json::from_slice::<serde_json::Value>(bytes)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok());
    let hex: String = cut
        .chunks(32)
        .map(hex::encode)
        .collect::<Vec<_>>()
        .join("\n");
    html! {
        p.meta {
            (bytes.len()) " bytes"
            @if cut.len() < bytes.len() { ", the first " (cut.len()) " shown" }
        }
        details open {
            summary { "text" }
            pre.payload data-view="text" { (shown(&String::from_utf8_lossy(cut))) }
        }
        @if let Some(json) = json {
            details {
                summary { "JSON" }
                pre.payload data-view="json" { (shown(&json[..json.floor_char_boundary(SHOWN_BYTES)])) }
            }
        }
        details {
            summary { "hex" }
            pre.payload data-view="hex" { (hex) }
        }
    }
}

/// `ms` as an operator reads it (see [`crate::times::when`]).
pub fn when(ms: u64) -> String {
    crate::times::when(ms, now_ms())
}

/// A link to a key's story.
pub fn key_link(route: &str, key: &str) -> Markup {
    let href = format!("/keys?route={}&q={}", encode(route), encode(key));
    html! { a.key href=(href) { (shown(key)) } }
}

/// `s` percent-encoded for a query string.
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A message for the operator, in a box.
pub fn notice(kind: &str, text: &str) -> Markup {
    html! { p class=(format!("notice {kind}")) { (text) } }
}

/// The hidden CSRF field of a changing form.
pub fn csrf(viewer: &Viewer) -> Markup {
    html! { input type="hidden" name="csrf" value=(viewer.csrf); }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_text_stays_text() {
        let hostile = "<script>alert(1)</script>\"><img src=x onerror=alert(2)>\u{1b}[31m\u{0}";
        let out = html! { (shown(hostile)) }.into_string();
        assert!(!out.contains("<script>") && !out.contains("<img"), "{out}");
        assert!(
            out.contains("&lt;script&gt;") && out.contains("\\u{1b}"),
            "{out}"
        );
        let link = key_link("r", "a&b=\"c\"").into_string();
        assert!(link.contains("q=a%26b%3D%22c%22"), "{link}");
        let big = vec![b'x'; SHOWN_BYTES * 2];
        let shown = payload(&big).into_string();
        assert!(shown.contains(&format!("the first {SHOWN_BYTES} shown")));
        assert!(shown.len() < SHOWN_BYTES * 4, "cut: {}", shown.len());
        // A JSON payload cut inside a character is cut before it.
        let wide = format!("[\"{}\"]", "é".repeat(SHOWN_BYTES));
        assert!(payload(wide.as_bytes())
            .into_string()
            .contains("data-view=\"json\""));
    }
}
