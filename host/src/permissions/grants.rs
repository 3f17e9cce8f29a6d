//! The subjects one kind of access to one stream takes, as JetStream's API names them (the
//! `$JS.API.*` requests async-nats sends for each call, and the subjects the server answers or
//! delivers on). Stream names are single subject tokens, so `<stream>` below never widens.

/// What a role does with one stream (or the stream under a KV bucket or object store).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// Reads single messages: its info, `get` and KV `entry` (direct gets), and its consumers'
    /// info. No consumer of its own: an ephemeral consumer names its delivery subject in the
    /// request, which the server does not check against any permission, so creating one
    /// could have the stream delivered anywhere in the account.
    Read,
    /// [`Access::Read`] and ephemeral ordered push consumers (KV watches and key listings,
    /// object reads, scans of the stream) whose deliveries and flow control go over the
    /// client's inbox and `$JS.FC.<stream>.>`. No pull: `CONSUMER.MSG.NEXT` on a name the
    /// server picks would reach every durable on the stream (a downstream service's, another
    /// deployment's).
    Watch,
    /// Reads and watches only the given subjects of it (a KV bucket's keys, `$KV.<bucket>.<key>`):
    /// direct gets that name the subject, and ordered consumers the client names, filtered to
    /// one of them (`CONSUMER.CREATE.<stream>.<name>.<subject>`, which the server checks
    /// against the request): a host's own routes in the contracts bucket of a source stream
    /// that other deployments share.
    Keys(Vec<String>),
    /// [`Access::Watch`] and pulls from ephemeral ordered pull consumers, whose names the
    /// server picks (`CONSUMER.MSG.NEXT.<stream>.*`, which reaches any durable on the stream
    /// too): the console's time windows.
    Scan,
    /// Reads it and consumes through the named durable pull consumers: binds them (a bind
    /// sends a create with the same settings), pulls, and acks, naks and terms their deliveries.
    Consume(Vec<String>),
    /// Administers it: creates, updates, purges and deletes the stream and any consumer on
    /// it, deletes single messages (the operator's `setup`, replays and purges).
    Admin,
}

/// The publish subjects `access` to `stream` needs.
pub fn publish(stream: &str, access: &Access) -> Vec<String> {
    let api = |s: &str| format!("$JS.API.{s}");
    // Consumer info reads, never takes messages (a KV key listing checks its consumer drained).
    let mut out = vec![
        api(&format!("STREAM.INFO.{stream}")),
        api(&format!("CONSUMER.INFO.{stream}.*")),
    ];
    let gets = [
        api(&format!("STREAM.MSG.GET.{stream}")),
        api(&format!("DIRECT.GET.{stream}")),
        api(&format!("DIRECT.GET.{stream}.>")),
        api(&format!("CONSUMER.LIST.{stream}")),
        api(&format!("CONSUMER.NAMES.{stream}")),
    ];
    // Ordered consumers: no name in the subject.
    let ordered = [
        api(&format!("CONSUMER.CREATE.{stream}")),
        format!("$JS.FC.{stream}.>"),
    ];
    match access {
        Access::Read => out.extend(gets),
        Access::Watch => out.extend(gets.into_iter().chain(ordered)),
        Access::Keys(subjects) => {
            for subject in subjects {
                out.push(api(&format!("DIRECT.GET.{stream}.{subject}")));
                out.push(api(&format!("CONSUMER.CREATE.{stream}.*.{subject}")));
            }
            out.push(format!("$JS.FC.{stream}.>"));
        }
        Access::Scan => {
            out.extend(gets.into_iter().chain(ordered));
            out.push(api(&format!("CONSUMER.MSG.NEXT.{stream}.*")));
        }
        Access::Consume(durables) => {
            out.extend(gets);
            for d in durables {
                // `CONSUMER.CREATE.<stream>.<name>` or, with one filter, `.<name>.<filter>`.
                out.push(api(&format!("CONSUMER.CREATE.{stream}.{d}")));
                out.push(api(&format!("CONSUMER.CREATE.{stream}.{d}.>")));
                out.push(api(&format!("CONSUMER.MSG.NEXT.{stream}.{d}")));
                out.push(format!("$JS.ACK.{stream}.{d}.>"));
            }
        }
        Access::Admin => {
            out.extend(gets.into_iter().chain(ordered));
            for verb in ["CREATE", "UPDATE", "DELETE", "PURGE", "MSG.DELETE"] {
                out.push(api(&format!("STREAM.{verb}.{stream}")));
            }
            for verb in ["CREATE", "DELETE", "PAUSE", "UNPIN", "RESET"] {
                out.push(api(&format!("CONSUMER.{verb}.{stream}.>")));
            }
            out.push(api(&format!("CONSUMER.DURABLE.CREATE.{stream}.*")));
            out.push(api(&format!("CONSUMER.MSG.NEXT.{stream}.*")));
            out.push(format!("$JS.ACK.{stream}.>"));
        }
    }
    out
}

/// The subscribe subjects `access` to `stream` needs beyond the inbox.
pub fn subscribe(stream: &str, access: &Access) -> Vec<String> {
    match access {
        // A message that ran out of deliveries (the host dead-letters it from the stream).
        Access::Consume(_) => vec![format!(
            "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream}.*"
        )],
        Access::Read | Access::Watch | Access::Keys(_) | Access::Scan | Access::Admin => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consuming_binds_and_acks_only_the_named_consumers() {
        let p = publish("EVENTS", &Access::Consume(vec!["hosts-a".into()]));
        assert!(p.contains(&"$JS.API.CONSUMER.CREATE.EVENTS.hosts-a".to_string()));
        assert!(p.contains(&"$JS.ACK.EVENTS.hosts-a.>".to_string()));
        assert!(!p
            .iter()
            .any(|s| s.contains("STREAM.CREATE") || s == "$JS.ACK.EVENTS.>"));
        assert!(p.contains(&"$JS.API.CONSUMER.MSG.NEXT.EVENTS.hosts-a".to_string()));
        let r = publish("EVENTS", &Access::Read);
        assert!(!r.iter().any(|s| s.starts_with("$JS.ACK")));
        // Reading pulls from no consumer: not another service's durable.
        assert!(!r.iter().any(|s| s.contains("MSG.NEXT")));
        assert!(!p.iter().any(|s| s.contains("MSG.NEXT") && s.ends_with('*')));
        // Neither consumes through a consumer it did not name (item 4 of issue 47).
        for s in p.iter().chain(&r) {
            assert_ne!(s, "$JS.API.CONSUMER.CREATE.EVENTS", "no ephemeral consumer");
        }
        let w = publish("EVENTS", &Access::Watch);
        assert!(w.contains(&"$JS.API.CONSUMER.CREATE.EVENTS".to_string()));
        let k = publish("KV_c", &Access::Keys(vec!["$KV.c.upper".into()]));
        assert!(k.contains(&"$JS.API.CONSUMER.CREATE.KV_c.*.$KV.c.upper".to_string()));
        assert!(k.contains(&"$JS.API.DIRECT.GET.KV_c.$KV.c.upper".to_string()));
        assert!(!k
            .iter()
            .any(|s| (s.ends_with(".>") && s.contains("DIRECT")) || s.ends_with("CREATE.KV_c")));
        let a = publish("EVENTS", &Access::Admin);
        assert!(a.contains(&"$JS.API.STREAM.CREATE.EVENTS".to_string()));
    }
}
