//! The `dedup:handler` WIT package this binary serves, embedded byte for byte, so guest
//! authors get the exact contract without a checkout of this repository (`dedup-host wit`).

use std::path::Path;

/// Every file of the package: (file name, contents), as in `wit/`.
pub const FILES: [(&str, &str); 5] = [
    ("config.wit", include_str!("../../wit/config.wit")),
    ("handler.wit", include_str!("../../wit/handler.wit")),
    ("log.wit", include_str!("../../wit/log.wit")),
    ("types.wit", include_str!("../../wit/types.wit")),
    ("world.wit", include_str!("../../wit/world.wit")),
];

/// Writes the package into `dir` (created when missing); returns the paths written.
pub fn write(dir: &Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    std::fs::create_dir_all(dir)?;
    FILES
        .iter()
        .map(|(name, text)| {
            let path = dir.join(name);
            std::fs::write(&path, text)?;
            Ok(path)
        })
        .collect()
}
