//! CPU time this process has used: what limits that protect the host from a guest are
//! measured in (DESIGN.md rule 21), since wall time stretches on a busy machine.

use std::time::Duration;

/// CPU time this process has used so far (user + system, from `/proc/self/stat`, in the
/// kernel's 100 Hz clock ticks); zero where that file does not exist.
pub fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<u64> = after_name
        .split_whitespace()
        .skip(11) // state .. cmajflt
        .take(2) // utime, stime
        .filter_map(|f| f.parse().ok())
        .collect();
    Duration::from_millis(fields.iter().sum::<u64>() * 10)
}

#[cfg(test)]
mod tests {
    #[test]
    fn cpu_time_grows_with_work_not_with_sleep() {
        let start = super::process_cpu();
        std::thread::sleep(std::time::Duration::from_millis(300));
        let slept = super::process_cpu() - start;
        let mut x = 0u64;
        let spin = std::time::Instant::now();
        while spin.elapsed() < std::time::Duration::from_millis(300) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let worked = super::process_cpu() - start - slept;
        assert!(worked > slept, "{worked:?} vs {slept:?}");
    }
}
