//! Durations on command lines and in configuration files, one grammar for every `baton`
//! process: `humantime`'s (`500ms`, `10s`, `5m`, `2h`, `1d`, `1m 30s`) or bare seconds (`7`,
//! `0.5`), the form older flags took.

use std::str::FromStr;
use std::time::Duration;

use serde::Deserialize;

/// A duration written `500ms`, `10s`, `5m`, `2h`, `1d` (or bare seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

impl FromStr for HumanDuration {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if let Ok(secs) = s.parse::<f64>() {
            return Duration::try_from_secs_f64(secs)
                .map(Self)
                .map_err(|_| format!("`{s}` is not a duration (seconds, 0 or more)"));
        }
        humantime::parse_duration(s)
            .map(Self)
            .map_err(|e| format!("`{s}` is not a duration like 500ms, 10s, 5m, 2h: {e}"))
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Secs(u64),
            Fraction(f64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Secs(s) => Ok(Self(Duration::from_secs(s))),
            Raw::Fraction(s) => Duration::try_from_secs_f64(s)
                .map(Self)
                .map_err(serde::de::Error::custom),
            Raw::Text(t) => t.parse().map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Duration, String> {
        s.parse::<HumanDuration>().map(|d| d.0)
    }

    #[test]
    fn units_and_bare_seconds() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse("1m 30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("7"), Ok(Duration::from_secs(7)));
        assert_eq!(parse("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("1.0"), Ok(Duration::from_secs(1)));
        for bad in ["7 parsecs", "", "-1", "NaN", "inf", "1e999"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn from_numbers_and_text() {
        #[derive(Deserialize)]
        struct F {
            a: HumanDuration,
            b: HumanDuration,
            c: HumanDuration,
        }
        let f: F = serde_json::from_str(r#"{"a": 3, "b": 0.25, "c": "2m"}"#).unwrap();
        assert_eq!(f.a.0, Duration::from_secs(3));
        assert_eq!(f.b.0, Duration::from_millis(250));
        assert_eq!(f.c.0, Duration::from_secs(120));
    }
}
