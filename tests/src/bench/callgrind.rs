//! Valgrind client requests that mark the measured part of an instruction-count bench: the
//! bench dumps callgrind's counters (which zeroes them) right before the part it measures and
//! again right after it, so warm-up, set-up and shutdown fall into other dumps. Outside
//! valgrind each request is a handful of register rotations that change nothing.
//!
//! The requests are the ones `valgrind/callgrind.h` defines (the "special instruction"
//! preamble followed by `xchg rbx, rbx`); written here rather than through a crate, as they are
//! a few lines. On targets other than x86-64 they do nothing.

use std::ffi::CString;

/// `VG_USERREQ_TOOL_BASE('C', 'T')`: callgrind's first request code.
#[cfg(target_arch = "x86_64")]
const CALLGRIND_BASE: usize = (b'C' as usize) << 24 | (b'T' as usize) << 16;
/// `VG_USERREQ__DUMP_STATS_AT`: dump the counters with a reason, then zero them.
#[cfg(target_arch = "x86_64")]
const DUMP_STATS_AT: usize = CALLGRIND_BASE + 3;
/// `VG_USERREQ__RUNNING_ON_VALGRIND`.
#[cfg(target_arch = "x86_64")]
const RUNNING_ON_VALGRIND: usize = 0x1001;

/// Sends client request `code` with one argument; returns `default` when not under valgrind.
#[cfg(target_arch = "x86_64")]
fn request(code: usize, arg: usize, default: usize) -> usize {
    let args: [usize; 6] = [code, arg, 0, 0, 0, 0];
    let mut result = default;
    // SAFETY: the rotations of rdi add up to 128 bits (rdi ends as it began) and
    // `xchg rbx, rbx` changes nothing; valgrind recognises the sequence, reads `args` through
    // rax and answers in rdx. Memory may be read (the argument), so no `nomem`.
    unsafe {
        std::arch::asm!(
            "rol rdi, 3",
            "rol rdi, 13",
            "rol rdi, 61",
            "rol rdi, 51",
            "xchg rbx, rbx",
            inout("rdx") result,
            in("rax") args.as_ptr(),
            inout("rdi") 0usize => _,
            options(nostack),
        );
    }
    result
}

/// Whether this process runs under valgrind.
pub fn running_on_valgrind() -> bool {
    #[cfg(target_arch = "x86_64")]
    return request(RUNNING_ON_VALGRIND, 0, 0) > 0;
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Writes callgrind's counters since the last dump to a new dump file whose `desc:` line
/// names `reason` (`Trigger: Client Request: <reason>`), then zeroes them.
pub fn dump(reason: &str) {
    let reason = CString::new(reason).expect("a dump reason without NUL bytes");
    #[cfg(target_arch = "x86_64")]
    request(DUMP_STATS_AT, reason.as_ptr() as usize, 0);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = reason;
}
