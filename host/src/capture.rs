//! Which streams capture which subjects: the streams the server holds (read once) and the ones
//! a config declares (its source and `[[output_streams]]`, which `setup` creates). `tail`
//! follows every stream a filter reaches; `setup`, a host start and a reload refuse a route
//! whose `allowed_outputs` subject no stream captures, or captures only in part (`out.>` over
//! a stream of `out.a.>`): every output there would fail to publish and be retried without
//! end. A user who may not list the server's streams (or whose outputs reach a stream of
//! another account through an import) gets a warning naming the subjects it could not check.

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

    /// Every `allowed_outputs` subject of `config`'s routes that these streams do not
    /// capture whole (none of its subjects, or only some), in config order.
    pub fn uncaptured(&self, config: &Config) -> Vec<Uncaptured> {
        let patterns: Vec<Vec<&str>> = (self.streams.iter())
            .flat_map(|(_, subjects)| subjects.iter().map(|s| s.split('.').collect()))
            .collect();
        let patterns: Vec<&[&str]> = patterns.iter().map(Vec::as_slice).collect();
        let mut found = Vec::new();
        for r in &config.routes {
            for f in &r.allowed_outputs {
                let capturing = self.capturing(f);
                let tokens: Vec<&str> = f.split('.').collect();
                let missed = match capturing.is_empty() {
                    true => None,
                    false => match missed_subject(&tokens, &patterns) {
                        Some(missed) => Some(missed.join(".")),
                        None => continue,
                    },
                };
                found.push(Uncaptured {
                    route: r.name.clone(),
                    filter: f.clone(),
                    capturing,
                    missed,
                });
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

/// A subject matched by the filter `tokens` that none of `patterns` (subject filters, split
/// into tokens) captures, if there is one: a `*` or `>` of the filter stands for a token no
/// pattern names, so the subject found is one an output could really have.
fn missed_subject(tokens: &[&str], patterns: &[&[&str]]) -> Option<Vec<String>> {
    let Some((&first, rest)) = tokens.split_first() else {
        // The subject ends here: a pattern must end here too.
        return (!patterns.iter().any(|p| p.is_empty())).then(Vec::new);
    };
    if patterns.iter().any(|p| p.first() == Some(&">")) {
        return None; // `>` takes this token and every one after it
    }
    let after = |token: &str| -> Vec<&[&str]> {
        (patterns.iter())
            .filter(|p| p.first().is_some_and(|t| *t == "*" || *t == token))
            .map(|p| &p[1..])
            .collect()
    };
    let (token, missed) = match first {
        // One token, then any number (none too): a pattern must end after it, and `>`
        // after it must be captured.
        ">" => {
            let token = unnamed_token(patterns);
            let wild = after(&token);
            let missed = match wild.iter().any(|p| p.is_empty()) {
                false => Some(Vec::new()),
                true => missed_subject(&[">"], &wild),
            };
            (token, missed)
        }
        "*" => {
            let token = unnamed_token(patterns);
            let missed = missed_subject(rest, &after(&token));
            (token, missed)
        }
        literal => (literal.to_string(), missed_subject(rest, &after(literal))),
    };
    missed.map(|mut subject| {
        subject.insert(0, token);
        subject
    })
}

/// A token that no pattern names at its first position (`x`, `x1`, ...).
fn unnamed_token(patterns: &[&[&str]]) -> String {
    let named = |t: &str| patterns.iter().any(|p| p.first() == Some(&t));
    (0..)
        .map(|i| match i {
            0 => "x".to_string(),
            i => format!("x{i}"),
        })
        .find(|t| !named(t))
        .expect("a free token")
}

/// A route's `allowed_outputs` subject that no stream captures, or that streams capture only
/// in part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uncaptured {
    /// The route.
    pub route: String,
    /// The subject filter in its `allowed_outputs`.
    pub filter: String,
    /// The streams that capture some of its subjects (none: it is not captured at all).
    pub capturing: Vec<String>,
    /// One subject it matches that no stream captures, when streams capture it in part.
    pub missed: Option<String>,
}

impl std::fmt::Display for Uncaptured {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (route, filter) = (&self.route, &self.filter);
        match &self.missed {
            None => write!(
                f,
                "route `{route}`: allowed_outputs subject `{filter}` is captured by no stream (none in the config, none on the server), so every output there would fail to publish and be retried without end; add an `[[output_streams]]` entry whose subjects capture `{filter}` (`dedup-host setup` creates it), or remove `{filter}` from the route's allowed_outputs"
            ),
            Some(missed) => write!(
                f,
                "route `{route}`: allowed_outputs subject `{filter}` is captured only in part: stream(s) {:?} capture some of its subjects but no stream captures `{missed}` (for one), so an output there would fail to publish and be retried without end; add an `[[output_streams]]` entry (or widen a stream's subjects) to capture all of `{filter}`, or narrow `{filter}` in the route's allowed_outputs to what the streams capture",
                self.capturing
            ),
        }
    }
}

/// Output subjects that no stream captures: a config error, found against the server.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
pub struct UncapturedOutputs(pub Vec<Uncaptured>);

/// What a check of a config's `allowed_outputs` subjects against the streams found.
#[derive(Debug)]
pub enum OutputCheck {
    /// Every one is captured whole.
    Captured,
    /// Some are not: a config error.
    Refused(UncapturedOutputs),
    /// The server's streams could not be listed (the user may not, say): the subjects the
    /// config's own streams do not capture whole went unchecked, one warning each.
    Unchecked(Vec<String>),
}

/// Checks `config`'s output subjects against the streams the server holds and the config
/// declares. Refuses none it could not see: a stream of another account, reached through an
/// import, may capture them.
pub async fn check(js: &Context, config: &Config) -> OutputCheck {
    let held = match Streams::held(js).await {
        Ok(held) => held,
        Err(e) => {
            let declared = Streams::default().with_declared(config);
            let unchecked = declared.uncaptured(config).iter()
                .map(|u| format!("route `{}`: allowed_outputs subject `{}` is not captured whole by a stream of this config, and {e:#} (may this user not send `$JS.API.STREAM.LIST`?), so it was not checked: make sure a stream captures it (a stream of another account, through an import, can), or every output there fails to publish and is retried without end", u.route, u.filter))
                .collect::<Vec<_>>();
            return match unchecked.is_empty() {
                true => OutputCheck::Captured,
                false => OutputCheck::Unchecked(unchecked),
            };
        }
    };
    match held.with_declared(config).refuse_uncaptured(config) {
        Ok(()) => OutputCheck::Captured,
        Err(refused) => OutputCheck::Refused(refused),
    }
}

/// Refuses `config` when a route's `allowed_outputs` subject is captured by no stream the
/// server holds or the config declares, or only in part; warns (and goes on) for the
/// subjects it could not check.
pub async fn check_outputs(js: &Context, config: &Config) -> Result<(), UncapturedOutputs> {
    match check(js, config).await {
        OutputCheck::Captured => Ok(()),
        OutputCheck::Refused(refused) => Err(refused),
        OutputCheck::Unchecked(warnings) => {
            for warning in &warnings {
                tracing::warn!("{warning}");
            }
            Ok(())
        }
    }
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
                filter: "spare.>".into(),
                capturing: vec![],
                missed: None,
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

    #[test]
    fn a_wildcard_captured_only_in_part_is_named_with_a_subject_no_stream_captures() {
        let c = config("[\"out.>\", \"done.*\", \"whole.>\"]", "");
        let held = Streams {
            streams: vec![
                ("OUT".into(), vec!["out.a.>".into()]),
                ("DONE".into(), vec!["done.a".into(), "done.b".into()]),
                ("W1".into(), vec!["whole.*".into()]),
                ("W2".into(), vec!["whole.*.>".into()]),
            ],
        };
        let found = held.uncaptured(&c);
        let missed: Vec<(&str, Option<&str>)> = (found.iter())
            .map(|u| (u.filter.as_str(), u.missed.as_deref()))
            .collect();
        // `whole.>` is captured whole by two streams together.
        assert_eq!(
            missed,
            [("out.>", Some("out.x")), ("done.*", Some("done.x"))]
        );
        assert_eq!(found[0].capturing, ["OUT"]);
        let text = found[0].to_string();
        assert!(
            text.contains("`out.>` is captured only in part")
                && text.contains("[\"OUT\"]")
                && text.contains("no stream captures `out.x`"),
            "{text}"
        );
    }

    #[test]
    fn the_subject_found_missing_is_one_the_filter_matches_and_no_pattern_does() {
        let cases: [(&str, &[&str], Option<&str>); 9] = [
            ("a.>", &["a.>"], None),
            ("a.>", &["a.*"], Some("a.x.x")),
            ("a.>", &["a.*", "a.*.>"], None),
            ("a.>", &["a.x", "a.x1", "a.*.b"], Some("a.x2")),
            ("a.*.c", &["a.b.c"], Some("a.x.c")),
            ("a.*.c", &["*.*.c"], None),
            ("a.b", &["a.*"], None),
            ("a.b", &["a.b.c"], Some("a.b")),
            (">", &["a.>", "*"], Some("x.x")),
        ];
        for (filter, patterns, expected) in cases {
            let split: Vec<Vec<&str>> = patterns.iter().map(|p| p.split('.').collect()).collect();
            let split: Vec<&[&str]> = split.iter().map(Vec::as_slice).collect();
            let tokens: Vec<&str> = filter.split('.').collect();
            let missed = missed_subject(&tokens, &split).map(|m| m.join("."));
            assert_eq!(missed.as_deref(), expected, "{filter} over {patterns:?}");
            if let Some(m) = &missed {
                assert!(crate::subject::matches(filter, m), "{filter} matches {m}");
                assert!(
                    patterns.iter().all(|p| !crate::subject::matches(p, m)),
                    "{m}"
                );
            }
        }
    }
}
