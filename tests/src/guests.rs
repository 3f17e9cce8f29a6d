//! Where the built guests and the `dedup-host` binary are.

use std::path::PathBuf;

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The path of the guest `name` built by `guests/build.sh`. Panics with the fix when missing.
pub fn guest(name: &str) -> PathBuf {
    let path = workspace_root()
        .join("guests/out")
        .join(format!("{name}.wasm"));
    assert!(
        path.exists(),
        "guest `{}` is not built: run `guests/build.sh` (or `bash tests/run.sh`)",
        path.display()
    );
    path
}

/// The `dedup-host` binary next to the running test executable (`target/<profile>/`).
pub fn host_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let mut dir = exe.parent().expect("exe dir").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let bin = dir.join("dedup-host");
    assert!(
        bin.exists(),
        "`{}` is not built: run `cargo build --release --workspace --bins` (or `bash tests/run.sh`)",
        bin.display()
    );
    bin
}

/// What one `dedup-host` command printed and how it exited.
#[derive(Debug)]
pub struct CliRun {
    /// The exit code (-1 when killed by a signal).
    pub code: i32,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// Runs `dedup-host <args[0]> --config <config> <args[1..]>` to its end.
pub fn cli(config: &std::path::Path, args: &[&str]) -> CliRun {
    let out = std::process::Command::new(host_binary())
        .arg(args[0])
        .arg("--config")
        .arg(config)
        .args(&args[1..])
        .output()
        .expect("run dedup-host");
    CliRun {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).to_string(),
    }
}

/// [`cli`] off the async runtime's threads, for a `#[tokio::test]`: (exit 0, all output).
pub async fn cli_async(config: &std::path::Path, args: &[&str]) -> (bool, String) {
    let config = config.to_path_buf();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = cli(&config, &args);
        (run.code == 0, format!("{}{}", run.stdout, run.stderr))
    })
    .await
    .expect("the command's thread")
}
