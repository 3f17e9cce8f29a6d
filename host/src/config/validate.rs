//! Configuration validation: every problem, each with its field path.

use std::collections::HashSet;

use super::{Config, DedupMode, EffectsMode, KeySource, Problem};
use crate::runtime::engine::DEFAULT_POOL_MEMORY_BYTES;
use crate::subject;

/// Collects problems as they are found.
#[derive(Default)]
struct Problems(Vec<Problem>);

impl Problems {
    fn check(&mut self, ok: bool, field: impl Into<String>, message: impl Into<String>) {
        if !ok {
            self.0.push(Problem {
                field: field.into(),
                message: message.into(),
            });
        }
    }
}

/// Whether `name` is usable as a stream, consumer, bucket or route name.
fn is_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

impl Config {
    /// Checks the whole configuration and returns every problem found.
    pub fn validate(&self) -> Result<(), Vec<Problem>> {
        let mut p = Problems::default();
        self.validate_nats(&mut p);
        self.validate_timing(&mut p);
        self.validate_names(&mut p);
        self.validate_routes(&mut p);
        self.validate_effects(&mut |ok, field, message| p.check(ok, field, message));
        self.telemetry
            .validate(&mut |ok, field, message| p.check(ok, field, message));
        if let Some(dir) = &self.components.dir {
            let dir = self.resolve(dir);
            p.check(
                dir.is_dir(),
                "components.dir",
                format!(
                    "`{}` is not a directory: create it, then put `<route>.wasm` files in it",
                    dir.display()
                ),
            );
        }
        if p.0.is_empty() {
            Ok(())
        } else {
            Err(p.0)
        }
    }

    fn validate_nats(&self, p: &mut Problems) {
        let n = &self.nats;
        for (i, url) in n.urls.iter().enumerate() {
            p.check(
                !url.trim().is_empty() && !url.contains(char::is_whitespace),
                format!("nats.urls[{i}]"),
                format!(
                    "`{}` is not a server URL (example: nats://127.0.0.1:4222): remove the spaces",
                    super::without_credentials(url)
                ),
            );
        }
        p.check(
            n.user.is_some() == n.password.is_some(),
            "nats.password",
            "`user` and `password` go together: set both or neither",
        );
        let methods = [
            n.user.is_some(),
            n.token.is_some(),
            n.nkey_seed.is_some(),
            n.creds_file.is_some(),
        ];
        p.check(
            methods.iter().filter(|m| **m).count() <= 1,
            "nats",
            "choose one authentication method: user/password, token, nkey_seed or creds_file",
        );
        p.check(
            n.tls_cert.is_some() == n.tls_key.is_some(),
            "nats.tls_key",
            "`tls_cert` and `tls_key` go together: set both or neither",
        );
        if let Some(prefix) = &n.inbox_prefix {
            p.check(
                crate::subject::literal_problem(prefix).is_none() && !prefix.contains('.'),
                "nats.inbox_prefix",
                format!("`{prefix}` is not one subject token without wildcards (example: `_INBOX_orders`): a prefix with dots sits under another's (`_INBOX.orders` under `_INBOX.>`), whose users could then read these replies"),
            );
        }
        if let Some(seed) = &n.nkey_seed {
            p.check(
                seed.starts_with("SU"),
                "nats.nkey_seed",
                "an nkey user seed starts with `SU`",
            );
        }
        for (field, path) in [
            ("nats.creds_file", &n.creds_file),
            ("nats.tls_ca", &n.tls_ca),
            ("nats.tls_cert", &n.tls_cert),
            ("nats.tls_key", &n.tls_key),
        ] {
            if let Some(path) = path {
                let resolved = self.resolve(path);
                p.check(
                    resolved.is_file(),
                    field,
                    format!("file `{}` does not exist", resolved.display()),
                );
            }
        }
    }

    fn validate_timing(&self, p: &mut Problems) {
        let (c, s) = (&self.claims, &self.source);
        p.check(
            !c.heartbeat.is_zero(),
            "claims.heartbeat",
            "must be greater than zero",
        );
        p.check(c.lease > c.heartbeat * 3, "claims.lease", format!("must exceed 3 x claims.heartbeat ({:?}), so a live owner renews it at least twice before it lapses", c.heartbeat * 3));
        p.check(s.ack_wait > c.heartbeat * 3, "source.ack_wait", format!("must exceed 3 x claims.heartbeat ({:?}), so progress acks keep the message from being redelivered", c.heartbeat * 3));
        let exclusive = self.routes.iter().any(|r| r.exclusive_by.is_some());
        p.check(!exclusive || c.clock_skew < s.ack_wait, "claims.clock_skew", format!("{:?} must be below source.ack_wait ({:?}) with an exclusive route: a queued last delivery claimed later than the ack wait less the skew is released unrun, so every one would be; lower claims.clock_skew or raise source.ack_wait", c.clock_skew, s.ack_wait));
        p.check(
            c.max_age > c.lease * 2,
            "claims.max_age",
            "must be far longer than claims.lease (default 24h)",
        );
        for (field, replicas) in [
            ("claims.replicas", c.replicas),
            ("source.replicas", s.replicas),
            ("dead_letter.replicas", self.dead_letter.replicas),
            ("components.replicas", self.components.replicas),
        ] {
            p.check(matches!(replicas, 1 | 3 | 5), field, "must be 1, 3 or 5");
        }
        for (i, o) in self.output_streams.iter().enumerate() {
            p.check(
                matches!(o.replicas, 1 | 3 | 5),
                format!("output_streams[{i}].replicas"),
                "must be 1, 3 or 5",
            );
        }
        p.check(
            s.server_max_deliver >= i64::from(s.max_deliver) * 4,
            "source.server_max_deliver",
            format!(
                "must be at least 4 x source.max_deliver ({}): the host counts attempts itself, and a message waiting on another host's claim is redelivered many times",
                i64::from(s.max_deliver) * 4
            ),
        );
        p.check(
            s.max_deliver >= 1,
            "source.max_deliver",
            "must be at least 1 attempt",
        );
        p.check(
            !s.backoff.is_empty(),
            "source.backoff",
            "give at least one delay, e.g. [\"1s\", \"5s\"]",
        );
        p.check(
            s.backoff.iter().all(|d| !d.is_zero()),
            "source.backoff",
            "delays must be greater than zero",
        );
        p.check(
            self.host.concurrency >= 1,
            "host.concurrency",
            "must be at least 1",
        );
        p.check(
            self.host.long_running_lanes != Some(0),
            "host.long_running_lanes",
            "must be at least 1",
        );
        p.check(
            self.host.max_in_flight >= self.host.concurrency,
            "host.max_in_flight",
            "must be at least host.concurrency",
        );
        // The drain waits up to the grace for in-flight work, then acks and flushes.
        p.check(
            self.host.drain_timeout > self.host.shutdown_grace,
            "host.drain_timeout",
            format!(
                "{:?} does not exceed host.shutdown_grace ({:?}), the wait for in-flight work that the drain includes: the host would give up before that wait ends, leaving work unacked at every stop; raise host.drain_timeout above host.shutdown_grace (with time for the final flush) or lower host.shutdown_grace, keeping host.drain_timeout below the platform's kill deadline (Kubernetes' terminationGracePeriodSeconds, 30 s by default)",
                self.host.drain_timeout, self.host.shutdown_grace
            ),
        );
        p.check(
            s.max_ack_pending >= self.host.max_in_flight as i64,
            "source.max_ack_pending",
            "must be at least host.max_in_flight (default 256), or the host sits idle",
        );
        let gap = self.longest_rerun_gap();
        for (i, o) in self.output_streams.iter().enumerate() {
            // A forever stream refuses a re-run's output by its subject, at any time.
            if o.dedup == DedupMode::Forever {
                continue;
            }
            // Fenced routes' re-runs are refused by the claim record, not the window.
            if o.effects == EffectsMode::Fenced && !self.window_route_reaches(&o.subjects) {
                continue;
            }
            p.check(o.duplicate_window > gap, format!("output_streams[{i}].duplicate_window"), format!("output stream `{}` keeps message ids for {:?}, not longer than the longest gap between two runs of one key ({gap:?} = {}): a re-run could publish an output twice; raise its duplicate_window above {gap:?} (`dedup-host setup --apply` changes an existing stream), or shorten what the gap adds up", o.name, o.duplicate_window, super::RERUN_GAP_TERMS));
        }
        self.validate_source_outputs(p, gap);
        let dl_gap = self.dead_letter_gap();
        p.check(self.dead_letter.duplicate_window > dl_gap, "dead_letter.duplicate_window", format!("{:?} is shorter than lease + clock_skew + largest backoff ({dl_gap:?}): a dead letter could be stored twice", self.dead_letter.duplicate_window));
    }

    fn validate_names(&self, p: &mut Problems) {
        p.check(
            is_name(&self.source.stream),
            "source.stream",
            "use only letters, digits, `_` and `-`",
        );
        p.check(
            is_name(&self.source.consumer),
            "source.consumer",
            "use only letters, digits, `_` and `-`",
        );
        p.check(
            is_name(&self.claims.bucket),
            "claims.bucket",
            "use only letters, digits, `_` and `-`",
        );
        p.check(
            is_name(&self.dead_letter.stream),
            "dead_letter.stream",
            "use only letters, digits, `_` and `-`",
        );
        for (field, name) in [
            ("components.bucket", &self.components.bucket),
            ("components.status_bucket", &self.components.status_bucket),
        ] {
            p.check(
                is_name(name),
                field,
                "use only letters, digits, `_` and `-`",
            );
        }
        p.check(
            !self.components.poll_interval.is_zero(),
            "components.poll_interval",
            "must be greater than zero",
        );
        let dl = &self.dead_letter.subject;
        p.check(
            subject::is_valid_filter(dl) && !dl.contains(['*', '>']),
            "dead_letter.subject",
            format!("`{dl}` is not a plain subject"),
        );
        for (i, s) in self.source.subjects.iter().enumerate() {
            p.check(
                subject::is_valid_filter(s),
                format!("source.subjects[{i}]"),
                subject::filter_error(s),
            );
        }
        for s in self.source_subjects() {
            p.check(!subject::overlaps(&s, dl), "dead_letter.subject", format!("`{dl}` is consumed by source subject `{s}`: dead letters would be processed again"));
        }
        p.check(
            !subject::reaches_reserved(dl),
            "dead_letter.subject",
            format!(
                "`{dl}` is in a reserved server namespace ($JS., $KV., $O., $SYS., $NRG., _INBOX.)"
            ),
        );
        // Every stream the host creates needs a name of its own.
        let mut streams: Vec<(String, &str)> = vec![
            ("source.stream".into(), self.source.stream.as_str()),
            (
                "dead_letter.stream".into(),
                self.dead_letter.stream.as_str(),
            ),
        ];
        for (i, o) in self.output_streams.iter().enumerate() {
            streams.push((format!("output_streams[{i}].name"), o.name.as_str()));
        }
        for (i, (field, name)) in streams.iter().enumerate() {
            if let Some((other, _)) = streams[..i].iter().find(|(_, n)| n == name) {
                p.check(
                    false,
                    field.clone(),
                    format!("stream `{name}` is also `{other}`: each stream needs its own name"),
                );
            }
        }
        for (i, o) in self.output_streams.iter().enumerate() {
            for s in &o.subjects {
                p.check(
                    !subject::overlaps(s, dl),
                    format!("output_streams[{i}].subjects"),
                    format!("`{s}` also captures the dead-letter subject `{dl}`"),
                );
                for src in self.source_subjects() {
                    p.check(!subject::overlaps(s, &src), format!("output_streams[{i}].subjects"), format!("`{s}` overlaps source subject `{src}`: a subject can be captured by one stream only (chained routes publish into the source stream without an output stream)"));
                }
            }
        }
        for (i, o) in self.output_streams.iter().enumerate() {
            p.check(
                is_name(&o.name),
                format!("output_streams[{i}].name"),
                "use only letters, digits, `_` and `-`",
            );
            p.check(
                !o.subjects.is_empty(),
                format!("output_streams[{i}].subjects"),
                "give at least one subject",
            );
            for (j, s) in o.subjects.iter().enumerate() {
                p.check(
                    subject::is_valid_filter(s),
                    format!("output_streams[{i}].subjects[{j}]"),
                    subject::filter_error(s),
                );
            }
        }
    }

    fn validate_routes(&self, p: &mut Problems) {
        p.check(
            !self.routes.is_empty(),
            "routes",
            "add at least one [[routes]] entry with name, subject and component",
        );
        let mut names = HashSet::new();
        for (i, r) in self.routes.iter().enumerate() {
            let at = |f: &str| format!("routes[{i}].{f}");
            p.check(
                is_name(&r.name),
                at("name"),
                format!("`{}`: use only letters, digits, `_` and `-`", r.name),
            );
            p.check(
                names.insert(r.name.as_str()),
                at("name"),
                format!("`{}` is used by two routes", r.name),
            );
            p.check(
                subject::is_valid_filter(&r.subject),
                at("subject"),
                subject::filter_error(&r.subject),
            );
            if !self.source.subjects.is_empty() {
                let covered = self
                    .source
                    .subjects
                    .iter()
                    .any(|s| subject::covers(s, &r.subject));
                p.check(covered, at("subject"), format!("`{}` is not covered by source.subjects {:?}: the route would never see a message", r.subject, self.source.subjects));
            }
            if let Some(component) = &r.component {
                let component = self.resolve(component);
                p.check(
                    component.is_file(),
                    at("component"),
                    format!(
                        "file `{}` does not exist (build its project with `dedup-host build`, or leave `component` out to take it from the object store)",
                        component.display()
                    ),
                );
            }
            if self.source.dedup == DedupMode::Forever {
                p.check(
                    matches!(r.key, KeySource::SubjectToken(_)),
                    at("key"),
                    "with source.dedup = \"forever\" the event's identity is its subject: publish each event on a subject of its own (e.g. `orders.created.<order-id>`) and take the key from that token (key = { subject_token = 2 })",
                );
            }
            check_key_source(p, &at("key"), &r.subject, &r.key);
            if let Some(by) = &r.exclusive_by {
                check_key_source(p, &at("exclusive_by"), &r.subject, by);
            }
            p.check(
                !r.coalesce || r.exclusive_by.is_some(),
                at("coalesce"),
                "coalescing keeps the newest message per entity: set exclusive_by too",
            );
            if let Some(n) = r.partitions {
                p.check(
                    r.exclusive_by.is_some(),
                    at("partitions"),
                    "partitions spread an exclusive route's entities: set exclusive_by too, or remove partitions",
                );
                p.check(
                    (1..=super::route::MAX_PARTITIONS).contains(&n),
                    at("partitions"),
                    format!("is {n}; use 1 to {}", super::route::MAX_PARTITIONS),
                );
            }
            p.check(
                r.max_payload_bytes > 0,
                at("max_payload_bytes"),
                "must be greater than zero",
            );
            p.check(
                !r.limits.deadline.is_zero(),
                at("limits.deadline"),
                "must be greater than zero",
            );
            if let Some(wall) = r.limits.wall {
                p.check(
                    wall >= r.limits.deadline,
                    at("limits.wall"),
                    format!(
                        "is {wall:?}, shorter than limits.deadline ({:?}): the guest could never use its CPU time; make it at least the deadline, or leave it out (3 x the deadline)",
                        r.limits.deadline
                    ),
                );
            }
            p.check(
                r.limits.memory_bytes <= DEFAULT_POOL_MEMORY_BYTES,
                at("limits.memory_bytes"),
                format!("at most {DEFAULT_POOL_MEMORY_BYTES} bytes"),
            );
            p.check(
                r.limits.fuel != Some(0),
                at("limits.fuel"),
                "must be greater than zero, or left out for no fuel limit",
            );
            for (j, f) in r.allowed_outputs.iter().enumerate() {
                let field = at(&format!("allowed_outputs[{j}]"));
                p.check(
                    subject::is_valid_filter(f),
                    field.clone(),
                    subject::filter_error(f),
                );
                p.check(
                    !subject::reaches_reserved(f),
                    field.clone(),
                    format!("`{f}` reaches the server's reserved namespaces ($JS., $KV., $O., $SYS., $NRG., _INBOX.): name the output subjects, e.g. `orders.done.>`"),
                );
                p.check(
                    !subject::overlaps(f, &r.subject),
                    field.clone(),
                    format!("`{f}` covers the route's own subject `{}`: its outputs would come back to it in a loop", r.subject),
                );
                p.check(
                    !subject::overlaps(f, &self.dead_letter.subject),
                    field,
                    format!(
                        "`{f}` covers the dead-letter subject: a guest could forge dead letters"
                    ),
                );
            }
            if let Some(http) = &r.http {
                for problem in http.problems() {
                    p.check(false, at("http"), problem);
                }
                if let Some(file) = &http.ca_file {
                    let read = crate::runtime::http::tls::read_ca_file(&self.resolve(file));
                    p.check(
                        read.is_ok(),
                        at("http.ca_file"),
                        format!(
                            "{}: point `ca_file` at a PEM file of CA certificates, or remove it to trust only the system's roots",
                            read.err().unwrap_or_default()
                        ),
                    );
                }
                p.check(
                    r.claim != super::ClaimMode::After,
                    at("http"),
                    "outbound calls are journaled under the claim's lease, which a claim-after route does not take: use claim = \"before\", or remove [routes.http]",
                );
            }
            if let Some(dir) = &r.read_only_dir {
                let dir = self.resolve(dir);
                p.check(
                    dir.is_dir(),
                    at("read_only_dir"),
                    format!("`{}` is not a directory", dir.display()),
                );
            }
            p.check(
                r.concurrency != Some(0),
                at("concurrency"),
                "must be at least 1",
            );
            p.check(
                r.max_in_flight(&self.host) >= r.concurrency(&self.host),
                at("max_in_flight"),
                "must be at least the route's concurrency",
            );
            p.check(
                self.source.max_ack_pending >= r.max_in_flight(&self.host) as i64,
                "source.max_ack_pending",
                format!(
                    "must be at least route `{}`'s max_in_flight, or the route sits idle",
                    r.name
                ),
            );
        }
        for (i, a) in self.routes.iter().enumerate() {
            for b in &self.routes[i + 1..] {
                p.check(
                    !subject::overlaps(&a.subject, &b.subject),
                    format!("routes[{i}].subject"),
                    format!(
                        "`{}` overlaps route `{}`'s `{}`: a message must match one route",
                        a.subject, b.name, b.subject
                    ),
                );
            }
        }
    }
}

impl Config {
    /// Outputs that land in the source stream (a chain): a route must take them, or each one
    /// would come back as an unrouted message and be dead-lettered; and a window route's
    /// re-run would store one twice unless the source keeps message ids longer than a re-run
    /// can take. Checked here, before anything is created.
    fn validate_source_outputs(&self, p: &mut Problems, gap: std::time::Duration) {
        let sources = self.source_subjects();
        for (i, r) in self.routes.iter().enumerate() {
            for f in &r.allowed_outputs {
                let Some(src) = sources.iter().find(|s| subject::overlaps(f, s)) else {
                    continue;
                };
                let field = format!("routes[{i}].allowed_outputs");
                let taken = self.routes.iter().any(|t| subject::covers(&t.subject, f));
                p.check(taken, field.clone(), format!("route `{}`'s output subject `{f}` lands in the source stream (source subject `{src}`), where no route takes it: every output would come back as an unrouted message and be dead-lettered; give the outputs a stream of their own (an `[[output_streams]]` entry capturing `{f}`, with `source.subjects` narrowed so they do not capture it), or add a route for `{f}` (a chain)", r.name));
                let fenced = self.fenced_stream(r).is_some();
                let forever = self.source.dedup == DedupMode::Forever;
                p.check(fenced || forever || self.source.duplicate_window > gap, field, format!("route `{}`'s output subject `{f}` lands in the source stream, which keeps message ids for {:?} (`source.duplicate_window`), not longer than the longest gap between two runs of one key ({gap:?}): a re-run could publish an output twice; raise source.duplicate_window above {gap:?}, or give the outputs a stream of their own", r.name, self.source.duplicate_window));
            }
        }
    }
}

/// Checks one key source (`key` or `exclusive_by`) of a route on `subject`.
fn check_key_source(p: &mut Problems, at: &str, subject: &str, source: &KeySource) {
    match source {
        KeySource::Header(h) => p.check(
            !h.trim().is_empty(),
            format!("{at}.header"),
            "name a header, e.g. Nats-Msg-Id",
        ),
        KeySource::JsonPointer(ptr) => p.check(
            ptr.starts_with('/'),
            format!("{at}.json_pointer"),
            format!("`{ptr}` is not a JSON pointer; it starts with `/`, e.g. /order/id"),
        ),
        KeySource::SubjectToken(t) => {
            let tokens: Vec<&str> = subject.split('.').collect();
            let ok = *t < tokens.len() && !tokens[..=*t].contains(&">");
            p.check(
                ok,
                format!("{at}.subject_token"),
                format!(
                    "subject `{subject}` has no token {t} on every message (tokens count from 0)"
                ),
            );
        }
    }
}

#[cfg(test)]
#[path = "validate_tests.rs"]
mod tests;
