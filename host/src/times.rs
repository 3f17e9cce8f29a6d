//! Times as an operator reads them: RFC 3339 in UTC with how far away they are ("in 12s",
//! "3s ago"). JSON output keeps the epoch milliseconds.

use std::time::{Duration, UNIX_EPOCH};

/// `ms` (Unix epoch milliseconds) as RFC 3339, with its distance from `now_ms`.
pub fn when(ms: u64, now_ms: u64) -> String {
    let at = humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms));
    format!("{at} ({})", relative(ms, now_ms))
}

/// "in 12s", "3m 5s ago" or "now", to the second.
pub fn relative(ms: u64, now_ms: u64) -> String {
    let seconds = |d: u64| humantime::format_duration(Duration::from_secs(d / 1000)).to_string();
    match ms.cmp(&now_ms) {
        _ if ms.abs_diff(now_ms) < 1000 => "now".into(),
        std::cmp::Ordering::Greater => format!("in {}", seconds(ms - now_ms)),
        _ => format!("{} ago", seconds(now_ms - ms)),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn times_read_as_dates_and_distances() {
        let now = 1_795_464_337_515;
        assert_eq!(
            super::when(now + 12_000, now),
            "2026-11-23T20:05:49Z (in 12s)"
        );
        assert_eq!(super::relative(now - 185_000, now), "3m 5s ago");
        assert_eq!(super::relative(now + 400, now), "now");
    }
}
