//! The ranks' counters as gsm reads them: Prometheus' text format (what a rank serves on
//! `GSM_METRICS` and leaves in `GSM_STATS_DIR`) parsed into one [`RankSnapshot`] per rank, and
//! two snapshots of a rank turned into rates ([`RankView`]) for `gsm top` and
//! `gsm run --stats`.
//!
//! The text is parsed by [`gossamer::parse_prometheus`], the reader of what the ranks write.

use std::collections::BTreeMap;

use gossamer::Sample;

/// A sample's label parsed as a number.
fn number(sample: &Sample, name: &str) -> Option<u32> {
    sample.label(name)?.parse().ok()
}

/// One worker's counters.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct WorkerCounts {
    pub(crate) requests: f64,
    pub(crate) inline: f64,
    pub(crate) batches: f64,
    pub(crate) idle: f64,
    pub(crate) runnable: f64,
    pub(crate) fibers: f64,
    pub(crate) properties: f64,
}

/// One link's counters, from this rank's worker to a peer's.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct LinkCounts {
    /// `tcp`, `shm` or `ucx`.
    pub(crate) transport: String,
    pub(crate) bytes_out: f64,
    pub(crate) bytes_in: f64,
}

/// One rank's counters at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct RankSnapshot {
    pub(crate) rank: u32,
    pub(crate) uptime: f64,
    pub(crate) workers: BTreeMap<u32, WorkerCounts>,
    /// By type name: requests and seconds (sampled estimates).
    pub(crate) types: BTreeMap<String, (f64, f64)>,
    /// By (worker, type name, id): requests (sampled estimates).
    pub(crate) hot: BTreeMap<(u32, String, String), f64>,
    /// By (worker, peer rank, peer worker).
    pub(crate) links: BTreeMap<(u32, u32, u32), LinkCounts>,
}

impl RankSnapshot {
    /// The snapshot in `text` (a rank's Prometheus text).
    pub(crate) fn from_text(text: &str) -> Result<RankSnapshot, String> {
        let mut snap = RankSnapshot::default();
        for s in gossamer::parse_prometheus(text)? {
            let Some(metric) = s.name.strip_prefix("gossamer_") else {
                continue;
            };
            if let Some(rank) = number(&s, "rank") {
                snap.rank = rank;
            }
            let worker = number(&s, "worker");
            let type_name = s.label("type").map(str::to_string);
            match (metric, worker, type_name) {
                ("uptime_seconds", _, _) => snap.uptime = s.value,
                ("type_requests_total", _, Some(t)) => snap.types.entry(t).or_default().0 = s.value,
                ("type_seconds_total", _, Some(t)) => snap.types.entry(t).or_default().1 = s.value,
                ("hot_property_requests", Some(w), Some(t)) => {
                    let id = s.label("id").unwrap_or_default().to_string();
                    snap.hot.insert((w, t, id), s.value);
                }
                (link, Some(w), _) if link.starts_with("link_") => {
                    let (Some(pr), Some(pw)) = (number(&s, "peer_rank"), number(&s, "peer_worker"))
                    else {
                        continue;
                    };
                    let counts = snap.links.entry((w, pr, pw)).or_default();
                    if let Some(t) = s.label("transport") {
                        counts.transport = t.to_string();
                    }
                    match link {
                        "link_bytes_out_total" => counts.bytes_out = s.value,
                        "link_bytes_in_total" => counts.bytes_in = s.value,
                        _ => {}
                    }
                }
                (worker_metric, Some(w), _) => {
                    let counts = snap.workers.entry(w).or_default();
                    match worker_metric {
                        "worker_requests_total" => counts.requests = s.value,
                        "worker_inline_requests_total" => counts.inline = s.value,
                        "worker_batches_total" => counts.batches = s.value,
                        "worker_spinning_seconds_total" | "worker_sleeping_seconds_total" => {
                            counts.idle += s.value
                        }
                        "worker_runnable_fibers" => counts.runnable = s.value,
                        "worker_fibers" => counts.fibers = s.value,
                        "worker_properties" => counts.properties = s.value,
                        _ => {}
                    }
                }
                _ => {}
            }
        }
        Ok(snap)
    }
}

/// What a rank did between two snapshots (or since it started).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RankView {
    pub(crate) rank: u32,
    pub(crate) uptime: f64,
    /// Seconds the rates are over.
    pub(crate) seconds: f64,
    pub(crate) workers: Vec<WorkerView>,
    /// Type name, requests per second, mean time per request in seconds.
    pub(crate) types: Vec<(String, f64, f64)>,
    /// Worker, type name, id, requests per second.
    pub(crate) hot: Vec<(u32, String, String, f64)>,
    /// Per peer rank: the transport, bytes out and in per second (summed over this rank's
    /// workers).
    pub(crate) links: Vec<LinkView>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct LinkView {
    pub(crate) peer: u32,
    pub(crate) transport: String,
    pub(crate) bytes_out: f64,
    pub(crate) bytes_in: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct WorkerView {
    pub(crate) worker: u32,
    /// Share of the time it was not idle, 0 to 1.
    pub(crate) busy: f64,
    pub(crate) requests_per_second: f64,
    /// Mean requests per batch (0 without batches).
    pub(crate) batch: f64,
    pub(crate) runnable: f64,
    pub(crate) fibers: f64,
    pub(crate) properties: f64,
}

impl RankView {
    /// The rates between `before` (`None`: the rank's start) and `now`. Counters that went
    /// down (a restarted rank) count from zero.
    pub(crate) fn between(before: Option<&RankSnapshot>, now: &RankSnapshot) -> RankView {
        let empty = RankSnapshot::default();
        let before = before
            .filter(|b| b.uptime <= now.uptime && b.rank == now.rank)
            .unwrap_or(&empty);
        let seconds = (now.uptime - before.uptime).max(1e-9);
        let delta = |now: f64, then: f64| if now >= then { now - then } else { now };
        let workers = now
            .workers
            .iter()
            .map(|(&worker, w)| {
                let b = before.workers.get(&worker).cloned().unwrap_or_default();
                let batches = delta(w.batches, b.batches);
                let batched = delta(w.requests - w.inline, b.requests - b.inline);
                WorkerView {
                    worker,
                    busy: (1.0 - delta(w.idle, b.idle) / seconds).clamp(0.0, 1.0),
                    requests_per_second: delta(w.requests, b.requests) / seconds,
                    batch: if batches > 0.0 {
                        batched / batches
                    } else {
                        0.0
                    },
                    runnable: w.runnable,
                    fibers: w.fibers,
                    properties: w.properties,
                }
            })
            .collect();
        let mut types: Vec<(String, f64, f64)> = now
            .types
            .iter()
            .map(|(name, &(requests, time))| {
                let (r0, t0) = before.types.get(name).copied().unwrap_or_default();
                let requests = delta(requests, r0);
                let mean = if requests > 0.0 {
                    delta(time, t0) / requests
                } else {
                    0.0
                };
                (name.clone(), requests / seconds, mean)
            })
            .filter(|t| t.1 > 0.0)
            .collect();
        types.sort_by(|a, b| b.1.total_cmp(&a.1));
        let mut hot: Vec<(u32, String, String, f64)> = now
            .hot
            .iter()
            .map(|(key, &requests)| {
                let then = before.hot.get(key).copied().unwrap_or_default();
                (
                    key.0,
                    key.1.clone(),
                    key.2.clone(),
                    delta(requests, then) / seconds,
                )
            })
            .filter(|h| h.3 > 0.0)
            .collect();
        hot.sort_by(|a, b| b.3.total_cmp(&a.3));
        let mut links: BTreeMap<u32, LinkView> = BTreeMap::new();
        for (key, l) in &now.links {
            let b = before.links.get(key).cloned().unwrap_or_default();
            let view = links.entry(key.1).or_insert_with(|| LinkView {
                peer: key.1,
                transport: l.transport.clone(),
                ..LinkView::default()
            });
            view.bytes_out += delta(l.bytes_out, b.bytes_out) / seconds;
            view.bytes_in += delta(l.bytes_in, b.bytes_in) / seconds;
        }
        RankView {
            rank: now.rank,
            uptime: now.uptime,
            seconds,
            workers,
            types,
            hot,
            links: links.into_values().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP gossamer_uptime_seconds x\n\
        gossamer_uptime_seconds{rank=\"1\"} 10\n\
        gossamer_worker_requests_total{rank=\"1\",worker=\"0\"} 1000\n\
        gossamer_worker_inline_requests_total{rank=\"1\",worker=\"0\"} 0\n\
        gossamer_worker_batches_total{rank=\"1\",worker=\"0\"} 100\n\
        gossamer_worker_spinning_seconds_total{rank=\"1\",worker=\"0\"} 1\n\
        gossamer_worker_sleeping_seconds_total{rank=\"1\",worker=\"0\"} 4\n\
        gossamer_type_requests_total{rank=\"1\",type=\"a::B<\\\"q\\\">\"} 512\n\
        gossamer_type_seconds_total{rank=\"1\",type=\"a::B<\\\"q\\\">\"} 0.5\n\
        gossamer_link_bytes_out_total{rank=\"1\",worker=\"0\",peer_rank=\"0\",peer_worker=\"1\",transport=\"tcp\"} 2000\n";

    #[test]
    fn a_ranks_text_reads_as_its_counters() {
        let snap = RankSnapshot::from_text(TEXT).unwrap();
        assert_eq!((snap.rank, snap.uptime), (1, 10.0));
        let view = RankView::between(None, &snap);
        let w = &view.workers[0];
        assert_eq!((w.requests_per_second, w.batch, w.busy), (100.0, 10.0, 0.5));
        assert_eq!(
            view.types,
            vec![("a::B<\"q\">".to_string(), 51.2, 0.5 / 512.0)]
        );
        let link = LinkView {
            peer: 0,
            transport: "tcp".into(),
            bytes_out: 200.0,
            bytes_in: 0.0,
        };
        assert_eq!(view.links, vec![link]);
    }

    #[test]
    fn rates_are_over_the_time_between_snapshots() {
        let before = RankSnapshot::from_text(TEXT).unwrap();
        let mut now = before.clone();
        now.uptime = 12.0;
        now.workers.get_mut(&0).unwrap().requests = 1400.0;
        now.workers.get_mut(&0).unwrap().idle = 6.0;
        let view = RankView::between(Some(&before), &now);
        assert_eq!(view.seconds, 2.0);
        assert_eq!(view.workers[0].requests_per_second, 200.0);
        assert_eq!(view.workers[0].busy, 0.5);
    }
}
