//! `dedup-host build`: runs the guest toolchain script (`guests/toolchain.sh`, embedded byte
//! for byte, the same one the repository's `guests/build.sh` uses) on a project.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use thiserror::Error;

use super::{detect, ProjectError};

/// The toolchain script.
const SCRIPT: &str = include_str!("../../../guests/toolchain.sh");

/// The script's exit code for a missing toolchain (it has printed what to install).
const MISSING_TOOLCHAIN: i32 = 3;

/// Why a build failed.
#[derive(Debug, Error)]
pub enum BuildError {
    /// The project could not be read.
    #[error(transparent)]
    Project(#[from] ProjectError),
    /// A toolchain is missing; the script said which and how to install it.
    #[error(
        "the {0} toolchain is missing (see above); install it, or run `dedup-host build --install`"
    )]
    MissingToolchain(&'static str),
    /// The compiler or componentizer failed; its output is above.
    #[error("building the {language} handler in `{dir}` failed (exit {code}; the toolchain's output is above)")]
    Failed {
        /// The language.
        language: &'static str,
        /// The project.
        dir: PathBuf,
        /// The script's exit code.
        code: i32,
    },
    /// bash could not be started.
    #[error("cannot run bash for the toolchain script: {0}")]
    Spawn(std::io::Error),
}

/// Builds the project in `dir` into `out` (default `<dir>/<name>.wasm`), installing missing
/// toolchains when `install` is set; returns the component's path.
pub fn build(dir: &Path, out: Option<&Path>, install: bool) -> Result<PathBuf, BuildError> {
    run(dir, out, install, false)
}

/// As [`build`], with the toolchain's output (its stdout and stderr) on this process's
/// stdout, so a caller that prints there (`dev --watch`) shows a compiler's error before the
/// line that says the build failed, in a terminal and in a pipe alike.
pub fn build_on_stdout(
    dir: &Path,
    out: Option<&Path>,
    install: bool,
) -> Result<PathBuf, BuildError> {
    run(dir, out, install, true)
}

fn run(
    dir: &Path,
    out: Option<&Path>,
    install: bool,
    on_stdout: bool,
) -> Result<PathBuf, BuildError> {
    let manifest = detect(dir)?;
    let out = out
        .map(Path::to_path_buf)
        .unwrap_or_else(|| dir.join(format!("{}.wasm", manifest.name)));
    let wit = dir.join("wit");
    if !wit.join("world.wit").is_file() {
        crate::wit::write(&wit).map_err(|source| ProjectError::Io {
            path: wit.clone(),
            source,
        })?;
        tracing::info!(dir = %wit.display(), "wrote the embedded WIT package");
    }
    let language = manifest.language.as_str();
    let mut command = Command::new("bash");
    if on_stdout {
        use std::os::fd::AsFd as _;
        let stdout = std::io::stdout();
        let fd = stdout.as_fd().try_clone_to_owned();
        command.stderr(Stdio::from(fd.map_err(BuildError::Spawn)?));
    }
    let status = command
        .arg("-c")
        .arg(SCRIPT)
        .arg("toolchain.sh")
        .args(["build", language])
        .arg(dir)
        .arg(&out)
        .arg(&wit)
        .env("DEDUP_INSTALL", if install { "1" } else { "0" })
        .status()
        .map_err(BuildError::Spawn)?;
    match status.code() {
        Some(0) => Ok(out),
        Some(MISSING_TOOLCHAIN) => Err(BuildError::MissingToolchain(manifest.language.title())),
        code => Err(BuildError::Failed {
            language,
            dir: dir.to_path_buf(),
            code: code.unwrap_or(-1),
        }),
    }
}
