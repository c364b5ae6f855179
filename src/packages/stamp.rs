//! Registry timestamps into Unix seconds: RFC 3339 as npm (`time`), PyPI
//! (`upload-time`) and crates.io (`pubtime`) write them, and the HTTP date
//! of a Go `.mod` file's `Last-Modified`. Pure; the one use of the crate's
//! calendar helper is here, so its move is a one-line change.

use crate::time::days_from_civil;

/// `2024-08-30T19:37:07Z`, with optional fraction (`.164843`) and a `Z` or
/// `±HH:MM` offset; `t` and `z` in either case. `None` for anything else.
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    let b = s.trim().as_bytes();
    if b.len() < 20 {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = b.get(r)?;
        if !t.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(t).ok()?.parse().ok()
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    if b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut i = 19;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if i == start {
            return None;
        }
    }
    let off = match b.get(i..)? {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), rest @ ..] if rest.len() == 5 && rest[2] == b':' => {
            let oh = num(i + 1..i + 3)?;
            let om = num(i + 4..i + 6)?;
            if oh > 23 || om > 59 {
                return None;
            }
            let o = oh * 3600 + om * 60;
            if *sign == b'+' {
                o
            } else {
                -o
            }
        }
        _ => return None,
    };
    Some(days_from_civil(y, mo as u32, d as u32) * 86400 + h * 3600 + mi * 60 + sec - off)
}

/// An HTTP date in the IMF-fixdate form every current server sends
/// (`Fri, 30 Aug 2024 19:37:07 GMT`); the obsolete forms are `None`.
pub fn parse_http_date(s: &str) -> Option<i64> {
    let s = s.trim();
    let rest = s.get(5..)?; // "Fri, "
    if s.as_bytes().get(3) != Some(&b',') {
        return None;
    }
    let mut it = rest.split(' ');
    let d: u32 = it.next()?.parse().ok()?;
    let mo = match it.next()? {
        "Jan" => 1,
        "Feb" => 2,
        "Mar" => 3,
        "Apr" => 4,
        "May" => 5,
        "Jun" => 6,
        "Jul" => 7,
        "Aug" => 8,
        "Sep" => 9,
        "Oct" => 10,
        "Nov" => 11,
        "Dec" => 12,
        _ => return None,
    };
    let y: i64 = it.next()?.parse().ok()?;
    let t = it.next()?;
    if it.next()? != "GMT" || it.next().is_some() || !(1..=31).contains(&d) {
        return None;
    }
    let mut hms = t.split(':').map(|p| p.parse::<i64>().ok());
    let (h, mi, sec) = (hms.next()??, hms.next()??, hms.next()??);
    if h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    Some(days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + sec)
}

/// Unix seconds as `2024-08-30T19:37:07Z` (for a recomputed Go `@latest`).
pub fn format_rfc3339(secs: i64) -> String {
    let (y, m, d) = crate::time::civil_from_days(secs.div_euclid(86400));
    let r = secs.rem_euclid(86400);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        r / 3600,
        r % 3600 / 60,
        r % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_timestamps() {
        let t = 1_725_046_627; // 2024-08-30T19:37:07Z
        assert_eq!(parse_rfc3339("2024-08-30T19:37:07Z"), Some(t));
        assert_eq!(parse_rfc3339("2024-08-30T19:37:07.164Z"), Some(t));
        assert_eq!(parse_rfc3339("2024-08-30T19:37:07.164843Z"), Some(t));
        assert_eq!(parse_rfc3339("2024-08-30T21:37:07+02:00"), Some(t));
        assert_eq!(parse_rfc3339("2024-08-30T18:37:07-01:00"), Some(t));
        for bad in [
            "2024-08-30",
            "2024-08-30T19:37:07",
            "2024-13-30T19:37:07Z",
            "2024-08-30T19:37:07.Z",
            "x024-08-30T19:37:07Z",
            "2024-08-30T19:37:07+0200",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
        assert_eq!(parse_http_date("Fri, 30 Aug 2024 19:37:07 GMT"), Some(t));
        assert_eq!(parse_http_date("Friday, 30-Aug-24 19:37:07 GMT"), None);
        assert_eq!(parse_http_date("Fri, 30 Aug 2024 19:37:07 UTC"), None);
        assert_eq!(format_rfc3339(t), "2024-08-30T19:37:07Z");
        assert_eq!(parse_rfc3339(&format_rfc3339(t)), Some(t));
    }
}
