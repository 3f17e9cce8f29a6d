//! The durable consumers a config needs on its source stream, and their names: computed from
//! the config alone, so set-up (which creates them) and ownership checks (which compare them
//! with what the server holds) agree without importing each other.

use crate::config::Config;
use crate::subject;

/// The durable name of a route's consumer: `<source.consumer>-<route>`.
pub fn route_consumer_name(config: &Config, route: &str) -> String {
    format!("{}-{route}", config.source.consumer)
}

/// The source subjects no single route covers whole: the filter of the consumer of unrouted
/// subjects (none when the routes take every source subject).
pub(crate) fn uncovered_subjects(config: &Config) -> Vec<String> {
    config
        .source_subjects()
        .into_iter()
        .filter(|s| !config.routes.iter().any(|r| subject::covers(&r.subject, s)))
        .collect()
}

/// Every durable consumer of the source stream the config needs, as (name, filter subjects,
/// whether it queues an exclusive route): one per route, and the one for unrouted subjects
/// when the routes do not cover every source subject. (An exclusive route's partition
/// consumers, on its queue, are created by the hosts.)
pub fn consumer_specs(config: &Config) -> Vec<(String, Vec<String>, bool)> {
    let mut specs: Vec<(String, Vec<String>, bool)> = config
        .routes
        .iter()
        .map(|r| {
            (
                route_consumer_name(config, &r.name),
                vec![r.subject.clone()],
                r.exclusive_by.is_some(),
            )
        })
        .collect();
    let uncovered = uncovered_subjects(config);
    if !uncovered.is_empty() {
        specs.push((config.source.consumer.clone(), uncovered, false));
    }
    specs
}
