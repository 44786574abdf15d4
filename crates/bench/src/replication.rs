//! What an active says about its followers on `/metrics`
//! (`--metrics-listen`): the replication lag histogram and the counters of
//! events, bytes and writes per follower. The generator reads them before
//! and after the measured window (`--metrics-addr`) and reports the
//! difference per follower.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// The longest `/metrics` answer read.
const MAX_ANSWER: u64 = 4 << 20;
/// The whole scrape: connect, request, answer.
const SCRAPE_DEADLINE: Duration = Duration::from_secs(2);

const LAG: &str = "ringlock_replication_lag_seconds";

/// One follower's replication over a window, from the active's metrics.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct FollowerReplication {
    /// The follower's address (the metrics' `follower` label).
    pub follower: String,
    /// Lag probes answered in the window.
    pub probes: u64,
    /// Mean lag, µs (the histogram's sum over its count).
    pub lag_mean_us: Option<f64>,
    /// The upper bound of the bucket that holds the median, the 99th
    /// percentile and the largest probe, µs. The buckets are powers of two
    /// (`le` is 2^k - 1 µs), so each is within a factor of two; `None`
    /// when there was no probe, or it is in the +Inf bucket.
    pub lag_p50_us: Option<f64>,
    pub lag_p99_us: Option<f64>,
    pub lag_max_us: Option<f64>,
    /// Probes given up (no answer within the peer timeout).
    pub probes_lost: u64,
    /// Grants, renewals, releases and expiries sent as deltas; their bytes;
    /// the writes they took.
    pub events: u64,
    pub bytes: u64,
    pub writes: u64,
}

/// One follower's series in one scrape.
#[derive(Debug, Clone, Default, PartialEq)]
struct Series {
    /// Cumulative bucket counts by upper bound (seconds), ascending.
    buckets: Vec<(f64, u64)>,
    count: u64,
    sum: f64,
    events: u64,
    bytes: u64,
    writes: u64,
    probes_lost: u64,
}

/// One scrape: the series of every follower that has a lag histogram.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Scrape(BTreeMap<String, Series>);

/// Reads `http://ADDR/metrics` within a deadline.
pub(crate) fn scrape(addr: &str) -> crate::Result<Scrape> {
    let start = Instant::now();
    let sock = addr
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| format!("{addr}: no address"))?;
    let mut stream = TcpStream::connect_timeout(&sock, SCRAPE_DEADLINE)?;
    stream.set_write_timeout(Some(SCRAPE_DEADLINE))?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")?;
    let mut answer = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let left = SCRAPE_DEADLINE.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Err(
                format!("{addr}/metrics: no whole answer within {SCRAPE_DEADLINE:?}").into(),
            );
        }
        stream.set_read_timeout(Some(left))?;
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&chunk[..n]);
        if answer.len() as u64 > MAX_ANSWER {
            return Err(format!("{addr}/metrics: answer over {MAX_ANSWER} bytes").into());
        }
    }
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{addr}/metrics: no HTTP answer"))?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        let status = head.lines().next().unwrap_or("");
        return Err(format!("{addr}/metrics: {status}").into());
    }
    Ok(parse(body))
}

/// The value of label `name` in a `{a="x",b="y"}` label set.
fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    let start = labels.find(&format!("{name}=\""))? + name.len() + 2;
    let len = labels[start..].find('"')?;
    Some(&labels[start..start + len])
}

/// The replication series of an OpenMetrics text.
pub(crate) fn parse(text: &str) -> Scrape {
    let mut out: BTreeMap<String, Series> = BTreeMap::new();
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some((name, rest)) = line.split_once('{') else {
            continue;
        };
        let Some((labels, value)) = rest.split_once('}') else {
            continue;
        };
        let Some(follower) = label(labels, "follower") else {
            continue;
        };
        let Some(value) = value.split_whitespace().next() else {
            continue;
        };
        let Ok(v) = value.parse::<f64>() else {
            continue;
        };
        let s = out.entry(follower.to_string()).or_default();
        let n = v as u64;
        match name {
            _ if name == format!("{LAG}_bucket") => {
                let le = match label(labels, "le") {
                    Some("+Inf") => f64::INFINITY,
                    Some(le) => match le.parse() {
                        Ok(le) => le,
                        Err(_) => continue,
                    },
                    None => continue,
                };
                s.buckets.push((le, n));
            }
            _ if name == format!("{LAG}_count") => s.count = n,
            _ if name == format!("{LAG}_sum") => s.sum = v,
            "ringlock_replication_events_total" => s.events = n,
            "ringlock_replication_bytes_total" => s.bytes = n,
            "ringlock_replication_writes_total" => s.writes = n,
            "ringlock_replication_probes_lost_total" => s.probes_lost = n,
            _ => {}
        }
    }
    // Only followers with a lag histogram: a server without one publishes
    // no lag, and nothing here pretends it does.
    out.retain(|_, s| !s.buckets.is_empty());
    for s in out.values_mut() {
        s.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    Scrape(out)
}

/// Per follower, what happened between two scrapes (a follower new in
/// `after` counts from zero).
pub(crate) fn delta(before: &Scrape, after: &Scrape) -> Vec<FollowerReplication> {
    let empty = Series::default();
    let mut out = Vec::new();
    for (follower, a) in &after.0 {
        let b = before.0.get(follower).unwrap_or(&empty);
        let at = |le: f64| -> u64 {
            b.buckets
                .iter()
                .find(|(x, _)| *x == le)
                .map_or(0, |(_, n)| *n)
        };
        let cumulative: Vec<(f64, u64)> = a
            .buckets
            .iter()
            .map(|&(le, n)| (le, n.saturating_sub(at(le))))
            .collect();
        let probes = a.count.saturating_sub(b.count);
        // The smallest bucket bound holding at least `rank` probes.
        let bound = |rank: u64| -> Option<f64> {
            if probes == 0 {
                return None;
            }
            let le = cumulative.iter().find(|(_, n)| *n >= rank.max(1))?.0;
            le.is_finite().then_some(le * 1e6)
        };
        let rank = |q: f64| (q * probes as f64).ceil() as u64;
        out.push(FollowerReplication {
            follower: follower.clone(),
            probes,
            lag_mean_us: (probes > 0).then(|| (a.sum - b.sum) * 1e6 / probes as f64),
            lag_p50_us: bound(rank(0.50)),
            lag_p99_us: bound(rank(0.99)),
            lag_max_us: bound(probes),
            probes_lost: a.probes_lost.saturating_sub(b.probes_lost),
            events: a.events.saturating_sub(b.events),
            bytes: a.bytes.saturating_sub(b.bytes),
            writes: a.writes.saturating_sub(b.writes),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{delta, parse};

    fn text(count: u64, buckets: &[(&str, u64)], events: u64) -> String {
        let mut t = String::from("# TYPE ringlock_replication_lag_seconds histogram\n");
        for f in ["127.0.0.1:2", "127.0.0.1:3"] {
            for (le, n) in buckets {
                t += &format!(
                    "ringlock_replication_lag_seconds_bucket{{follower=\"{f}\",le=\"{le}\"}} {n}\n"
                );
            }
            t += &format!("ringlock_replication_lag_seconds_sum{{follower=\"{f}\"}} 0.001\n");
            t += &format!("ringlock_replication_lag_seconds_count{{follower=\"{f}\"}} {count}\n");
            t += &format!("ringlock_replication_events_total{{follower=\"{f}\"}} {events}\n");
            t += &format!("ringlock_replication_writes_total{{follower=\"{f}\"}} 10\n");
        }
        t += "ringlock_replication_queued_bytes{follower=\"127.0.0.1:9\"} 13\n";
        t
    }

    #[test]
    fn percentiles_are_the_bounds_of_the_buckets_that_hold_them() {
        let before = parse(&text(
            2,
            &[("0.000063", 1), ("0.000127", 2), ("+Inf", 2)],
            5,
        ));
        // 100 new probes: 60 under 63 µs, 39 more under 127 µs, one under 255.
        let after = parse(&text(
            102,
            &[
                ("0.000063", 61),
                ("0.000127", 101),
                ("0.000255", 102),
                ("+Inf", 102),
            ],
            505,
        ));
        let d = delta(&before, &after);
        assert_eq!(d.len(), 2, "{d:?}");
        let f = &d[0];
        assert_eq!(f.follower, "127.0.0.1:2");
        assert_eq!(f.probes, 100);
        assert_eq!(f.lag_p50_us, Some(63.0));
        assert_eq!(f.lag_p99_us.map(f64::round), Some(127.0));
        assert_eq!(f.lag_max_us.map(f64::round), Some(255.0));
        assert_eq!(f.events, 500);
        assert_eq!(f.writes, 0);
        assert_eq!(f.lag_mean_us, Some(0.0));
    }

    #[test]
    fn no_lag_histogram_no_figures() {
        let t = "ringlock_replication_queued_bytes{follower=\"127.0.0.1:9\"} 13\n\
                 ringlock_replication_events_total{follower=\"127.0.0.1:9\"} 4\n";
        assert_eq!(parse(t), super::Scrape::default());
        let quiet = parse(&text(3, &[("0.000063", 3), ("+Inf", 3)], 1));
        let d = delta(&quiet, &quiet);
        assert_eq!(d[0].probes, 0);
        assert_eq!(d[0].lag_p50_us, None);
        assert_eq!(d[0].lag_mean_us, None);
    }
}
