//! `[console]`: where `dedup-host console` listens and who may log in (see
//! [`crate::console::auth`]).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// The console's settings. The environment (`DEDUP_CONSOLE_TOKEN`, `DEDUP_CONSOLE_USER`,
/// `DEDUP_CONSOLE_PASSWORD`) wins over the file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ConsoleConfig {
    /// Where it listens (default 127.0.0.1:8080; `--addr` wins). Any address that is not
    /// loopback needs a token, or a user and password.
    #[schemars(extend("x-default-text" = "`127.0.0.1:8080`"))]
    pub addr: Option<SocketAddr>,
    /// The token that logs in (at least 12 characters).
    #[serde(skip_serializing)]
    pub token: Option<String>,
    /// A user name, with `password`, instead of a token.
    pub user: Option<String>,
    /// The password of `user`.
    #[serde(skip_serializing)]
    pub password: Option<String>,
}
