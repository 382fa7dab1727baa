//! Durations and sizes as settings write them: `20us`, `250ms`, `3s`, `30`; `65536`, `64KiB`,
//! `1GiB`.

use std::time::Duration;

use super::error::EnvError;
use super::vars::*;

/// Reads `GSM_HEARTBEAT` and `GSM_PEER_TIMEOUT` through `get`, each its default when unset;
/// the timeout must be longer than the heartbeat.
///
/// ```
/// use std::time::Duration;
///
/// let get = |name: &str| (name == "GSM_PEER_TIMEOUT").then(|| "1s".to_string());
/// let (heartbeat, timeout) = gossamer::env::heartbeat_and_peer_timeout(&get)?;
/// assert_eq!((heartbeat, timeout), (gossamer::env::DEFAULT_HEARTBEAT, Duration::from_secs(1)));
/// # Ok::<(), gossamer::env::EnvError>(())
/// ```
pub fn heartbeat_and_peer_timeout(
    get: &impl Fn(&str) -> Option<String>,
) -> Result<(Duration, Duration), EnvError> {
    let heartbeat = duration_var(get, HEARTBEAT, DEFAULT_HEARTBEAT)?;
    let peer_timeout = duration_var(get, PEER_TIMEOUT, DEFAULT_PEER_TIMEOUT)?;
    if peer_timeout <= heartbeat {
        return Err(EnvError::PeerTimeoutTooShort {
            heartbeat,
            peer_timeout,
        });
    }
    Ok((heartbeat, peer_timeout))
}

/// Splits `"64KiB"` into `("64", "KiB")`, `None` without leading digits.
fn number_and_unit(value: &str) -> Option<(u64, &str)> {
    let value = value.trim();
    let end = value
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(value.len());
    let number = value[..end].parse().ok()?;
    Some((number, value[end..].trim()))
}

fn parse_duration(value: &str) -> Option<Duration> {
    let (n, unit) = number_and_unit(value)?;
    match unit {
        "" | "s" => Some(Duration::from_secs(n)),
        "ms" => Some(Duration::from_millis(n)),
        "us" | "µs" => Some(Duration::from_micros(n)),
        _ => None,
    }
}

fn parse_size(value: &str) -> Option<usize> {
    let (n, unit) = number_and_unit(value)?;
    let scale: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        _ => return None,
    };
    usize::try_from(n.checked_mul(scale)?).ok()
}

/// A positive duration, or `default` when unset.
pub(super) fn duration_var(
    get: &impl Fn(&str) -> Option<String>,
    var: &'static str,
    default: Duration,
) -> Result<Duration, EnvError> {
    duration_within(
        get,
        (var, default),
        |d| !d.is_zero(),
        "longer than 0",
        "a duration such as 250ms, 3s or 30 (seconds)",
    )
}

/// `GSM_SPIN`: a duration from 0 to [`MAX_SPIN`], or `None` (an adaptive spin) when unset.
pub(super) fn spin_var(
    get: &impl Fn(&str) -> Option<String>,
) -> Result<Option<Duration>, EnvError> {
    if get(SPIN).is_none() {
        return Ok(None);
    }
    let spin = duration_within(
        get,
        (SPIN, Duration::ZERO),
        |d| d <= MAX_SPIN,
        "at most 10ms (a bare number means seconds: write 20us)",
        "a duration such as 0, 20us or 1ms",
    )?;
    Ok(Some(spin))
}

/// The duration `var` holds (`default` when unset) if `fits` takes it; the errors say what
/// fits (`allowed`) and what a duration looks like (`expected`).
fn duration_within(
    get: &impl Fn(&str) -> Option<String>,
    (var, default): (&'static str, Duration),
    fits: impl Fn(Duration) -> bool,
    allowed: &'static str,
    expected: &'static str,
) -> Result<Duration, EnvError> {
    let Some(value) = get(var) else {
        return Ok(default);
    };
    match parse_duration(&value) {
        Some(d) if fits(d) => Ok(d),
        Some(_) => Err(EnvError::OutOfRange {
            var,
            value,
            allowed,
        }),
        None => Err(EnvError::Invalid {
            var,
            value,
            expected,
        }),
    }
}

/// A size in bytes, or `default` when unset.
pub(super) fn size_var(
    get: &impl Fn(&str) -> Option<String>,
    var: &'static str,
    default: usize,
) -> Result<usize, EnvError> {
    let Some(value) = get(var) else {
        return Ok(default);
    };
    parse_size(&value).ok_or(EnvError::Invalid {
        var,
        value,
        expected: "a size such as 65536, 64KiB, 1MiB or 1GiB",
    })
}

/// Reads `GSM_HEARTBEAT` and `GSM_PEER_TIMEOUT` through `get` and returns the peer timeout,
/// checked as [`Settings::from_vars`](crate::env::Settings::from_vars) checks it. `gsm run`
/// uses it to decide how long the other ranks get to stop after one failed.
///
/// ```
/// use std::time::Duration;
///
/// let t = gossamer::env::peer_timeout(|name| (name == "GSM_PEER_TIMEOUT").then(|| "500ms".into()))?;
/// assert_eq!(t, Duration::from_millis(500));
/// assert_eq!(gossamer::env::peer_timeout(|_| None)?, gossamer::env::DEFAULT_PEER_TIMEOUT);
/// # Ok::<(), gossamer::env::EnvError>(())
/// ```
pub fn peer_timeout(get: impl Fn(&str) -> Option<String>) -> Result<Duration, EnvError> {
    Ok(heartbeat_and_peer_timeout(&get)?.1)
}

/// Reads `GSM_OBJECT_TIMEOUT` through `get`: a positive duration, [`DEFAULT_OBJECT_TIMEOUT`]
/// when unset.
///
/// ```
/// use std::time::Duration;
///
/// let t = gossamer::env::object_timeout(|name| (name == "GSM_OBJECT_TIMEOUT").then(|| "2s".into()))?;
/// assert_eq!(t, Duration::from_secs(2));
/// assert!(gossamer::env::object_timeout(|_| Some("soon".into())).is_err());
/// # Ok::<(), gossamer::env::EnvError>(())
/// ```
pub fn object_timeout(get: impl Fn(&str) -> Option<String>) -> Result<Duration, EnvError> {
    duration_var(&get, OBJECT_TIMEOUT, DEFAULT_OBJECT_TIMEOUT)
}

#[cfg(test)]
mod tests {

    use std::time::Duration;

    use super::*;
    use crate::env::tests::*;

    #[test]
    fn rebalancing_is_off_unless_asked_for() {
        assert_eq!(job2_with(&[]).unwrap().rebalance, None);
        assert_eq!(job2_with(&[(REBALANCE, "off")]).unwrap().rebalance, None);
        assert_eq!(
            job2_with(&[(REBALANCE, "on")]).unwrap().rebalance,
            Some(trust::Rebalance::default())
        );
        assert_eq!(
            job2_with(&[(REBALANCE, "250")]).unwrap().rebalance,
            Some(trust::Rebalance::default().every(Duration::from_millis(250)))
        );
        let err = job2_with(&[(REBALANCE, "soon")]).unwrap_err();
        assert!(
            matches!(err, EnvError::Invalid { var: REBALANCE, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("on, off or a period"), "{err}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("3s"), Some(Duration::from_secs(3)));
        assert_eq!(parse_duration(" 30 "), Some(Duration::from_secs(30)));
        assert_eq!(parse_duration("2 s"), Some(Duration::from_secs(2)));
        assert_eq!(parse_duration("20us"), Some(Duration::from_micros(20)));
        assert_eq!(parse_duration("20µs"), Some(Duration::from_micros(20)));
        for bad in ["", "ms", "1.5s", "3m", "-1s", "99999999999999999999999"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
        let s = job2_with(&[
            (CONNECT_TIMEOUT, "5"),
            (HEARTBEAT, "100ms"),
            (PEER_TIMEOUT, "1s"),
        ])
        .unwrap();
        assert_eq!(s.connect_timeout, Duration::from_secs(5));
        assert_eq!(s.heartbeat, Duration::from_millis(100));
        assert_eq!(s.peer_timeout, Duration::from_secs(1));
        for var in [CONNECT_TIMEOUT, HEARTBEAT, PEER_TIMEOUT] {
            let err = job2_with(&[(var, "soon")]).unwrap_err();
            assert!(
                matches!(err, EnvError::Invalid { var: v, .. } if v == var),
                "{err}"
            );
            assert!(err.to_string().contains("250ms, 3s or 30"), "{err}");
            let err = job2_with(&[(var, "0ms")]).unwrap_err();
            assert!(
                matches!(err, EnvError::OutOfRange { var: v, .. } if v == var),
                "{err}"
            );
        }
    }

    #[test]
    fn spin_is_zero_to_ten_milliseconds() {
        assert_eq!(job2_with(&[]).unwrap().spin, None, "unset: adaptive");
        for (value, want) in [("0", 0), ("50us", 50), ("1ms", 1000), ("10ms", 10_000)] {
            let s = job2_with(&[(SPIN, value)]).unwrap();
            assert_eq!(s.spin, Some(Duration::from_micros(want)), "{value}");
        }
        for value in ["20", "11ms"] {
            let err = job2_with(&[(SPIN, value)]).unwrap_err();
            assert!(
                matches!(err, EnvError::OutOfRange { var: SPIN, .. }),
                "{value}: {err}"
            );
            assert!(err.to_string().contains("write 20us"), "{err}");
        }
        let err = job2_with(&[(SPIN, "a while")]).unwrap_err();
        assert!(matches!(err, EnvError::Invalid { var: SPIN, .. }), "{err}");
    }

    #[test]
    fn peer_timeout_must_exceed_heartbeat() {
        for (hb, pt) in [("3s", "3s"), ("1s", "500ms"), ("4", "3s")] {
            let err = job2_with(&[(HEARTBEAT, hb), (PEER_TIMEOUT, pt)]).unwrap_err();
            assert!(matches!(err, EnvError::PeerTimeoutTooShort { .. }), "{err}");
            assert!(
                err.to_string()
                    .contains("must be longer than GSM_HEARTBEAT")
            );
        }
        // The same check holds in a one-node rack, and in peer_timeout().
        assert!(with(&[(HEARTBEAT, "5s")]).is_err());
        let get = |name: &str| (name == PEER_TIMEOUT).then(|| "200ms".to_string());
        assert!(matches!(
            peer_timeout(get),
            Err(EnvError::PeerTimeoutTooShort { .. })
        ));
        let get = |name: &str| (name == PEER_TIMEOUT).then(|| "300ms".to_string());
        assert_eq!(peer_timeout(get).unwrap(), Duration::from_millis(300));
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("65536"), Some(65536));
        assert_eq!(parse_size("64KiB"), Some(65536));
        assert_eq!(parse_size("64kib"), Some(65536));
        assert_eq!(parse_size("1MiB"), Some(1 << 20));
        assert_eq!(parse_size("1GiB"), Some(1 << 30));
        assert_eq!(parse_size("12B"), Some(12));
        for bad in ["", "KiB", "64KB", "1.5MiB", "-1", "99999999999GiB"] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
        let s = job2_with(&[(FRAME, "4KiB"), (MAX_MESSAGE, "1MiB")]).unwrap();
        assert_eq!((s.frame, s.max_message), (4096, 1 << 20));
        assert_eq!(job2_with(&[(FRAME, "16MiB")]).unwrap().frame, 16 << 20);
        for bad in ["4095", "17MiB", "0"] {
            let err = job2_with(&[(FRAME, bad)]).unwrap_err();
            assert!(
                matches!(err, EnvError::OutOfRange { var: FRAME, .. }),
                "{err}"
            );
            assert!(err.to_string().contains("between 4KiB and 16MiB"));
        }
        let err = job2_with(&[(FRAME, "big")]).unwrap_err();
        assert!(matches!(err, EnvError::Invalid { var: FRAME, .. }), "{err}");
        for size in ["0", "4GiB"] {
            let err = job2_with(&[(MAX_MESSAGE, size)]).unwrap_err();
            assert!(
                matches!(
                    err,
                    EnvError::OutOfRange {
                        var: MAX_MESSAGE,
                        ..
                    }
                ),
                "{err}"
            );
        }
        let s = job2_with(&[(MAX_MESSAGE, "4294967295")]).unwrap();
        assert_eq!(s.max_message, u32::MAX as usize);
        let err = job2_with(&[(MAX_MESSAGE, "lots")]).unwrap_err();
        assert!(
            matches!(
                err,
                EnvError::Invalid {
                    var: MAX_MESSAGE,
                    ..
                }
            ),
            "{err}"
        );
    }
}
