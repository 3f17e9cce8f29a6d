//! CPU time used by this process or by one of its threads: what limits that protect the host from a guest are
//! measured in (DESIGN.md rule 21), since wall time stretches on a busy machine.

use std::time::Duration;

/// CPU time this process has used so far, all threads (`CLOCK_PROCESS_CPUTIME_ID`, to the
/// nanosecond: `/proc/self/stat`'s 10 ms ticks would read a tiny budget as never spent).
pub fn process_cpu() -> Duration {
    clock(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// CPU time the calling thread has used so far (`CLOCK_THREAD_CPUTIME_ID`): what a guest's
/// deadline is measured in, read while the guest runs on this thread. A read costs a system
/// call (about half a microsecond), so callers read it once per epoch tick, not per host call.
pub fn thread_cpu() -> Duration {
    clock(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// Reads one of the kernel's CPU-time clocks; zero where it cannot be read.
fn clock(id: libc::clockid_t) -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec and the clock id is a constant the kernel
    // knows; the call writes nothing else.
    let rc = unsafe { libc::clock_gettime(id, &mut now) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
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

    #[test]
    fn thread_cpu_counts_this_threads_work_only() {
        let start = super::thread_cpu();
        std::thread::sleep(std::time::Duration::from_millis(100));
        let slept = super::thread_cpu() - start;
        let spin = std::time::Instant::now();
        let mut x = 0u64;
        while spin.elapsed() < std::time::Duration::from_millis(100) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let worked = super::thread_cpu() - start - slept;
        assert!(worked > slept, "{worked:?} vs {slept:?}");
    }
}
