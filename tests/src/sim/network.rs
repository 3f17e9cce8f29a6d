//! Two faults of the network and of the server's cluster, drawn per run from a generator of
//! their own (so that runs without them are as before):
//!
//! - **a stream leader election**: for a while, a stream has no leader and every request to it
//!   is answered at once with an error (503, no responders): claim reads and writes, output
//!   publishes, queue copies, its consumers' pulls (nothing is delivered) and their acks,
//!   naks, terms and progress acks (lost), and a partition consumer's info;
//! - **a host partitioned from the server**: for a while, nothing it sends reaches the server
//!   and nothing reaches it. Its requests are neither answered nor applied (one still in
//!   flight as the cut comes may have landed); each fails only at the host's own request
//!   timeout ([`REQUEST_TIMEOUT_MS`], the JetStream context's), while its clock keeps running
//!   (unlike a pause, its heartbeat sees its lease lapse); its acks are lost; its pulls do not
//!   reach the server, so nothing is delivered to it. Then it heals and its connection works
//!   again. (A message the server hands to a pull request sent before the cut, lost in
//!   transit, is not modelled: when it is a last delivery and its advisory is missed, it is
//!   stranded, the known limit of `docs/src/how/simulation.md`; 22 of 28,000 runs, every
//!   one that failed, found only that.)

use std::collections::BTreeMap;

use super::consumer::Lane;
use super::rng::Rng;

/// How long a host waits for a request's answer (async-nats's JetStream context timeout,
/// which the host keeps): a request sent over a cut connection fails after this.
pub const REQUEST_TIMEOUT_MS: u64 = 5_000;

/// A stream of the model server, as a leader election sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// The claim store: the claim bucket, or a fenced route's stream (its outputs too).
    Claims,
    /// The output stream (a fenced route's is its claims' stream).
    Outputs,
    /// The source stream and its consumer.
    Source,
    /// The exclusive route's work queue and its partitions' consumers.
    Queue,
}

impl From<Lane> for Stream {
    fn from(lane: Lane) -> Self {
        match lane {
            Lane::Source => Stream::Source,
            Lane::Queue => Stream::Queue,
        }
    }
}

/// The run's network faults and the requests they cut off.
#[derive(Debug, Default)]
pub struct Network {
    /// Per host index, when it is partitioned from the server: from, until (empty: never).
    pub cut: Vec<(u64, u64)>,
    /// Hosts whose partition has begun (the run's bookkeeping of a pause's cost).
    noted: Vec<bool>,
    /// The leader election: from, until.
    pub election: (u64, u64),
    /// The streams without a leader during the election.
    pub electing: Vec<Stream>,
    /// Requests lost on a cut connection: id → (when they time out, whether a read).
    pub timing_out: BTreeMap<u64, (u64, bool)>,
}

impl Network {
    /// The faults of run `seed` with `hosts` hosts: one run in four partitions one or more
    /// hosts (each for half a lease to four leases, the lease being `lease_ms`), one in four
    /// has a leader election of one or more streams (for one to ten seconds, a fenced route's
    /// claims and outputs being one stream), all starting in `start..start + faults_ms`.
    pub fn draw(
        seed: u64,
        hosts: usize,
        fenced: bool,
        lease_ms: u64,
        start: u64,
        faults_ms: u64,
    ) -> Self {
        let mut rng = Rng::new(seed.rotate_left(41) ^ 0x0E7C);
        let mut network = Network {
            cut: vec![(0, 0); hosts],
            noted: vec![false; hosts],
            ..Network::default()
        };
        if rng.chance(250) {
            let cut = rng.range(1, hosts as u64);
            for _ in 0..cut {
                let host = rng.range(0, hosts as u64 - 1) as usize;
                let length = rng.range(lease_ms / 2, lease_ms * 4);
                let from = start + rng.range(0, faults_ms - length);
                network.cut[host] = (from, from + length);
            }
        }
        if rng.chance(250) {
            let length = rng.range(1_000, 10_000);
            let from = start + rng.range(0, faults_ms - length);
            network.election = (from, from + length);
            for stream in [
                Stream::Claims,
                Stream::Outputs,
                Stream::Source,
                Stream::Queue,
            ] {
                if rng.chance(500) {
                    network.electing.push(stream);
                }
            }
            if network.electing.is_empty() {
                network.electing.push(Stream::Claims);
            }
            let fenced_stream = [Stream::Claims, Stream::Outputs];
            if fenced && fenced_stream.iter().any(|s| network.electing.contains(s)) {
                for s in fenced_stream {
                    if !network.electing.contains(&s) {
                        network.electing.push(s);
                    }
                }
            }
        }
        network
    }

    /// Whether host `host` is partitioned from the server at `now`.
    pub fn cut_off(&self, host: usize, now: u64) -> bool {
        self.cut
            .get(host)
            .is_some_and(|(from, until)| (*from..*until).contains(&now))
    }

    /// Whether host `host`'s partition began at or before `now` and was not noted yet (once).
    pub fn newly_cut(&mut self, host: usize, now: u64) -> bool {
        let begun = self
            .cut
            .get(host)
            .is_some_and(|(from, until)| from < until && *from <= now);
        match self.noted.get_mut(host) {
            Some(noted) if begun && !*noted => {
                *noted = true;
                true
            }
            _ => false,
        }
    }

    /// Whether `stream` has no leader at `now`.
    pub fn electing(&self, stream: Stream, now: u64) -> bool {
        (self.election.0..self.election.1).contains(&now) && self.electing.contains(&stream)
    }

    /// Whether nothing waits to time out.
    pub fn quiet(&self) -> bool {
        self.timing_out.is_empty()
    }

    /// The requests whose timeout passed by `now`: (id, whether a read).
    pub fn timed_out(&mut self, now: u64) -> Vec<(u64, bool)> {
        let due: Vec<(u64, bool)> = (self.timing_out.iter())
            .filter(|(_, (at, _))| *at <= now)
            .map(|(id, (_, read))| (*id, *read))
            .collect();
        for (id, _) in &due {
            self.timing_out.remove(id);
        }
        due
    }

    /// A summary for the trace.
    pub fn describe(&self) -> String {
        format!(
            "partitions {:?}, election {:?} of {:?}",
            self.cut, self.election, self.electing
        )
    }
}
