//! Civil time without a calendar crate: dates in policies, RFC 3339
//! timestamps in log lines, and short durations (`90d`, `10m`).
//!
//! The bottom layer: used by the policy, the log writer, the commands and
//! the TLS certificates alike, it imports nothing of the crate. It owns
//! reading the clock and the calendar arithmetic; it does not own any
//! timeout (those are named constants beside the waits they bound).

use std::time::{SystemTime, UNIX_EPOCH};

/// Days since 1970-01-01 for a proleptic Gregorian date (Howard Hinnant's algorithm).
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let m = m as i64;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

/// (year, month, day) for days since the epoch.
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719468;
    let era = if z >= 0 { z } else { z - 146096 } / 146097;
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        _ => 28,
    }
}

/// `YYYY-MM-DD` (midnight UTC starting that day) or `YYYY-MM-DDTHH:MM:SSZ`
/// into Unix seconds.
pub fn parse_date(s: &str) -> Option<i64> {
    let s = s.trim();
    let (date, time) = match s.split_once(['T', ' ']) {
        Some((d, t)) => (d, Some(t)),
        None => (s, None),
    };
    let mut it = date.split('-');
    let y: i64 = it.next()?.parse().ok()?;
    let m: u32 = it.next()?.parse().ok()?;
    let d: u32 = it.next()?.parse().ok()?;
    if it.next().is_some() || !(1970..=9999).contains(&y) || !(1..=12).contains(&m) {
        return None;
    }
    if d == 0 || d > days_in_month(y, m) {
        return None;
    }
    let mut secs = days_from_civil(y, m, d) * 86400;
    if let Some(t) = time {
        let t = t.strip_suffix('Z').or_else(|| t.strip_suffix("+00:00"))?;
        let mut p = t.split(':');
        let hh: i64 = p.next()?.parse().ok()?;
        let mm: i64 = p.next()?.parse().ok()?;
        let ss: i64 = p.next().unwrap_or("0").parse().ok()?;
        if hh > 23 || mm > 59 || ss > 60 || p.next().is_some() {
            return None;
        }
        secs += hh * 3600 + mm * 60 + ss;
    }
    Some(secs)
}

/// `30s`, `10m`, `1h`, `90d`, `2w` into seconds.
pub fn parse_duration(s: &str) -> Option<u64> {
    let s = s.trim();
    let unit = s.chars().last()?;
    let mult = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86400,
        'w' => 7 * 86400,
        _ => return None,
    };
    let n: u64 = s[..s.len() - 1].parse().ok()?;
    n.checked_mul(mult)
}

/// Formats Unix milliseconds as `2026-11-29T20:00:00.123Z`. Written digit
/// by digit: this runs once per decision-log line, and the formatting
/// machinery cost more than the decision itself.
pub fn format_rfc3339_millis(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let milli = ms.rem_euclid(1000) as u32;
    let (y, m, d) = civil_from_days(secs.div_euclid(86400));
    let rem = secs.rem_euclid(86400) as u32;
    if !(0..=9999).contains(&y) {
        return format!(
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{milli:03}Z",
            rem / 3600,
            rem % 3600 / 60,
            rem % 60
        );
    }
    let y = y as u32;
    let mut b = *b"0000-00-00T00:00:00.000Z";
    let mut put = |at: usize, v: u32, width: usize| {
        let mut v = v;
        for i in (0..width).rev() {
            b[at + i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    };
    put(0, y, 4);
    put(5, m, 2);
    put(8, d, 2);
    put(11, rem / 3600, 2);
    put(14, rem % 3600 / 60, 2);
    put(17, rem % 60, 2);
    put(20, milli, 3);
    String::from_utf8(b.to_vec()).expect("ASCII digits")
}

/// Seconds as the largest whole unit `parse_duration` reads (`24h`, `90m`, `45s`).
pub fn format_duration(secs: u64) -> String {
    for (unit, n) in [("w", 7 * 86400), ("d", 86400), ("h", 3600), ("m", 60)] {
        if secs >= n && secs % n == 0 {
            return format!("{}{unit}", secs / n);
        }
    }
    format!("{secs}s")
}

pub fn format_date(secs: i64) -> String {
    let (y, m, d) = civil_from_days(secs.div_euclid(86400));
    format!("{y:04}-{m:02}-{d:02}")
}

pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

pub fn unix_now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_round_trip() {
        assert_eq!(parse_date("1970-01-01"), Some(0));
        assert_eq!(parse_date("2027-03-01"), Some(1_803_859_200));
        assert_eq!(parse_date("2024-02-29"), Some(1_709_164_800));
        assert_eq!(parse_date("2023-02-29"), None);
        assert_eq!(parse_date("2027-13-01"), None);
        assert_eq!(
            parse_date("2027-03-01T12:00:00Z"),
            Some(1_803_859_200 + 43200)
        );
        assert_eq!(
            format_rfc3339_millis(1_803_859_200_123),
            "2027-03-01T00:00:00.123Z"
        );
        assert_eq!(
            format_rfc3339_millis(1_796_041_567_009),
            "2026-11-30T12:26:07.009Z"
        );
        assert_eq!(format_rfc3339_millis(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_date(1_709_164_800), "2024-02-29");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90d"), Some(90 * 86400));
        assert_eq!(parse_duration("10m"), Some(600));
        assert_eq!(parse_duration("10"), None);
        assert_eq!(parse_duration("d"), None);
    }
}
