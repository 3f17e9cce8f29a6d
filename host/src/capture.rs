//! Which streams capture which subjects: the streams the server holds (read once) and the ones
//! a config declares (its source and `[[output_streams]]`, which `setup` creates). `tail`
//! follows every stream a filter reaches; `setup`, a host start and a reload refuse a route
//! whose `allowed_outputs` subject no stream captures (every output there would fail to
//! publish and be retried without end).

use anyhow::Context as _;
use async_nats::jetstream::Context;
use futures::StreamExt as _;

use crate::config::Config;
use crate::subject;

/// Streams, each with the subjects it captures.
#[derive(Debug, Clone, Default)]
pub struct Streams {
    streams: Vec<(String, Vec<String>)>,
}

impl Streams {
    /// The streams the server holds.
    pub async fn held(js: &Context) -> anyhow::Result<Self> {
        let mut streams = Vec::new();
        let mut listed = js.streams();
        while let Some(info) = listed.next().await {
            let info =
                info.context("cannot list the server's streams to see which capture a subject")?;
            streams.push((info.config.name.clone(), info.config.subjects.clone()));
        }
        Ok(Streams { streams })
    }

    /// Adds the streams `config` declares (its source stream and its output streams), for a
    /// check made before `setup` creates them.
    pub fn with_declared(mut self, config: &Config) -> Self {
        self.streams
            .push((config.source.stream.clone(), config.source_subjects()));
        for o in &config.output_streams {
            self.streams.push((o.name.clone(), o.subjects.clone()));
        }
        self
    }

    /// The names of the streams capturing some subject `filter` matches, each once, in order.
    pub fn capturing(&self, filter: &str) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for (name, subjects) in &self.streams {
            let reached = subjects.iter().any(|s| subject::overlaps(filter, s));
            if reached && !names.contains(name) {
                names.push(name.clone());
            }
        }
        names
    }

    /// Every `allowed_outputs` subject of `config`'s routes that none of these streams
    /// captures, in config order.
    pub fn uncaptured(&self, config: &Config) -> Vec<Uncaptured> {
        let mut found = Vec::new();
        for r in &config.routes {
            for f in &r.allowed_outputs {
                if self.capturing(f).is_empty() {
                    found.push(Uncaptured {
                        route: r.name.clone(),
                        filter: f.clone(),
                    });
                }
            }
        }
        found
    }

    /// [`Self::uncaptured`] as an error, when there is any.
    pub fn refuse_uncaptured(&self, config: &Config) -> Result<(), UncapturedOutputs> {
        let found = self.uncaptured(config);
        if found.is_empty() {
            Ok(())
        } else {
            Err(UncapturedOutputs(found))
        }
    }
}

/// A route's `allowed_outputs` subject that no stream captures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uncaptured {
    /// The route.
    pub route: String,
    /// The subject filter in its `allowed_outputs`.
    pub filter: String,
}

impl std::fmt::Display for Uncaptured {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (route, filter) = (&self.route, &self.filter);
        write!(
            f,
            "route `{route}`: allowed_outputs subject `{filter}` is captured by no stream (none in the config, none on the server), so every output there would fail to publish and be retried without end; add an `[[output_streams]]` entry whose subjects capture `{filter}` (`dedup-host setup` creates it), or remove `{filter}` from the route's allowed_outputs"
        )
    }
}

/// Output subjects that no stream captures: a config error, found against the server.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
pub struct UncapturedOutputs(pub Vec<Uncaptured>);

/// Refuses `config` when a route's `allowed_outputs` subject is captured by no stream the
/// server holds or the config declares.
pub async fn check_outputs(js: &Context, config: &Config) -> anyhow::Result<()> {
    let streams = Streams::held(js).await?.with_declared(config);
    streams.refuse_uncaptured(config)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(outputs: &str, output_streams: &str) -> Config {
        let text = format!(
            "[nats]\nurls = [\"nats://127.0.0.1:4222\"]\n[source]\nsubjects = [\"in.>\"]\n{output_streams}\n[[routes]]\nname = \"r\"\nsubject = \"in.r\"\nallowed_outputs = {outputs}\n"
        );
        Config::parse(&text, std::path::Path::new("t.toml"), std::env::temp_dir()).expect("valid")
    }

    #[test]
    fn an_output_subject_no_stream_captures_is_named_with_its_route() {
        let c = config("[\"out.a.>\", \"spare.>\"]", "");
        let held = Streams {
            streams: vec![("OUT".into(), vec!["out.>".into()])],
        };
        let e = held.with_declared(&c).refuse_uncaptured(&c).unwrap_err();
        assert_eq!(
            e.0,
            [Uncaptured {
                route: "r".into(),
                filter: "spare.>".into()
            }]
        );
        let text = e.to_string();
        assert!(
            text.contains("route `r`") && text.contains("`spare.>`"),
            "{text}"
        );
        assert!(text.contains("[[output_streams]]"), "{text}");
    }

    #[test]
    fn declared_streams_capture_before_they_exist() {
        let c = config(
            "[\"done.r\"]",
            "[[output_streams]]\nname = \"DONE\"\nsubjects = [\"done.*\"]\n",
        );
        let nothing = Streams::default().with_declared(&c);
        assert!(nothing.uncaptured(&c).is_empty());
        assert_eq!(
            nothing.capturing("in.>"),
            [crate::config::DEFAULT_STREAM.to_string()]
        );
    }

    #[test]
    fn a_filter_spanning_streams_reaches_each_once() {
        let held = Streams {
            streams: vec![
                ("A".into(), vec!["mk.a".into(), "mk.a.>".into()]),
                ("B".into(), vec!["mk.b".into()]),
                ("C".into(), vec!["other.>".into()]),
            ],
        };
        assert_eq!(held.capturing("mk.>"), ["A", "B"]);
        assert_eq!(held.capturing("mk.b"), ["B"]);
        assert!(held.capturing("nope").is_empty());
    }
}
