//! Wall-clock timestamps in the wire form (RFC 3339, UTC, milliseconds, `Z`), written by hand so
//! the core carries no calendar dependency and every rollout event's `time` is spelled one way.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, from the system clock (negative before 1970).
pub fn now_unix_millis() -> i64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_millis() as i64,
        Err(e) => -(e.duration().as_millis() as i64),
    }
}

/// The current time as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub fn now_rfc3339() -> String {
    format_unix_millis(now_unix_millis())
}

/// Formats milliseconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SS.mmmZ` (proleptic Gregorian,
/// UTC). Years outside 0..=9999 cannot be spelled in four digits and are clamped, because the
/// wire's Timestamp pattern has exactly four year digits.
pub fn format_unix_millis(ms: i64) -> String {
    const MIN: i64 = -62_167_219_200_000; // 0000-01-01T00:00:00.000Z
    const MAX: i64 = 253_402_300_799_999; // 9999-12-31T23:59:59.999Z
    let ms = ms.clamp(MIN, MAX);
    let days = ms.div_euclid(86_400_000);
    let rem = ms.rem_euclid(86_400_000);
    let (y, m, d) = civil_from_days(days);
    let (h, min, s, milli) = (
        rem / 3_600_000,
        rem / 60_000 % 60,
        rem / 1000 % 60,
        rem % 1000,
    );
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{min:02}:{s:02}.{milli:03}Z")
}

/// Days since 1970-01-01 to (year, month, day), after Howard Hinnant's `civil_from_days`: shift
/// the year to start in March so the leap day is last, then split into 400-year eras.
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11]
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// The inverse of [`civil_from_days`], used by the tests to walk every day both ways.
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = m as i64;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_leap(y: i64) -> bool {
        (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
    }

    #[test]
    fn known_instants() {
        assert_eq!(format_unix_millis(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_unix_millis(-1), "1969-12-31T23:59:59.999Z");
        assert_eq!(
            format_unix_millis(951_782_400_000),
            "2000-02-29T00:00:00.000Z"
        );
        assert_eq!(
            format_unix_millis(1_709_208_000_123),
            "2024-02-29T12:00:00.123Z"
        );
        assert_eq!(
            format_unix_millis(4_105_123_200_000),
            "2100-02-01T00:00:00.000Z"
        );
        assert_eq!(
            format_unix_millis(1_795_900_106_123),
            "2026-11-28T21:08:26.123Z"
        );
        assert_eq!(format_unix_millis(i64::MIN), "0000-01-01T00:00:00.000Z");
        assert_eq!(format_unix_millis(i64::MAX), "9999-12-31T23:59:59.999Z");
    }

    #[test]
    fn every_day_from_1600_to_2400_round_trips_and_is_contiguous() {
        let mut days = days_from_civil(1600, 1, 1);
        for y in 1600..2400 {
            for m in 1..=12u32 {
                let len = match m {
                    2 if is_leap(y) => 29,
                    2 => 28,
                    4 | 6 | 9 | 11 => 30,
                    _ => 31,
                };
                for d in 1..=len {
                    assert_eq!(civil_from_days(days), (y, m, d), "day {days}");
                    assert_eq!(days_from_civil(y, m, d), days);
                    days += 1;
                }
            }
        }
    }

    #[test]
    fn now_has_the_wire_shape() {
        let s = now_rfc3339();
        let b = s.as_bytes();
        assert_eq!(b.len(), 24, "{s}");
        assert_eq!(
            (b[4], b[7], b[10], b[13], b[16], b[19], b[23]),
            (b'-', b'-', b'T', b':', b':', b'.', b'Z')
        );
        assert!(s.starts_with("20"), "{s}");
    }
}
