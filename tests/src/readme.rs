//! The README's script blocks, run as a reader would: each block follows a marker line
//! (`<!-- authoring-script -->`) and is run by bash from a folder, with only `dedup-host` added
//! to the PATH, against a test's nats-server.

use std::path::Path;
use std::process::Command;

use crate::guests::{host_binary, workspace_root};

/// The `sh` block that follows `<!-- marker -->` in README.md.
pub fn block(marker: &str) -> String {
    let readme = std::fs::read_to_string(workspace_root().join("README.md")).unwrap();
    readme
        .split_once(&format!("<!-- {marker} -->\n```sh\n"))
        .and_then(|(_, rest)| rest.split_once("\n```"))
        .map(|(script, _)| script.to_string())
        .unwrap_or_else(|| panic!("README.md has no `{marker}` script block"))
}

/// Runs `script` with `bash -euo pipefail` in `folder`, with `dedup-host` on the PATH and
/// every command pointed at `nats_url`; returns whether it succeeded and what it printed.
pub fn run(script: &str, folder: &Path, nats_url: &str) -> (bool, String) {
    let bin = folder.join("..").join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let link = bin.join("dedup-host");
    if !link.exists() {
        std::os::unix::fs::symlink(host_binary(), &link).unwrap();
    }
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(folder)
        .env("PATH", path)
        // The script's host.toml names the usual local URL; the test's server is elsewhere.
        .env("DEDUP_HOST_NATS_URL", nats_url)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}
