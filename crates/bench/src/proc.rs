//! What the kernel says about a process: CPU time and resident memory, read
//! from `/proc` (no ptrace, no extra tools).

use std::fs;

/// Clock ticks per second of `utime`/`stime` in `/proc/<pid>/stat`.
fn clock_ticks() -> f64 {
    match rustix::param::clock_ticks_per_second() {
        0 => 100.0,
        ticks => ticks as f64,
    }
}

/// User + system CPU seconds used so far by `pid` (all its threads), or by
/// this process with `None`.
pub(crate) fn cpu_seconds(pid: Option<u32>) -> Option<f64> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/stat"),
        None => "/proc/self/stat".to_string(),
    };
    let stat = fs::read_to_string(path).ok()?;
    // The command name (field 2) may hold spaces and parentheses: the
    // fields we want are counted from the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After ")": state is field 3, so utime (14) and stime (15) are at 11, 12.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / clock_ticks())
}

/// Resident memory of `pid`: (VmRSS, VmHWM) in KiB.
pub(crate) fn rss_kib(pid: u32) -> Option<(u64, u64)> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        status
            .lines()
            .find(|l| l.starts_with(name))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// CPU seconds the whole machine has spent busy (all cores: user, nice,
/// system, irq, softirq, steal), from the first line of `/proc/stat`.
pub(crate) fn machine_busy_seconds() -> Option<f64> {
    let stat = fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // user nice system idle iowait irq softirq steal (guest is in user).
    let busy = f.first()? + f.get(1)? + f.get(2)? + f.get(5)? + f.get(6)? + f.get(7)?;
    Some(busy as f64 / clock_ticks())
}

/// Times `pid` was switched out involuntarily so far (preempted while it
/// could run): `nonvoluntary_ctxt_switches` of `/proc/<pid>/status`, summed
/// over its threads (the main thread's is the loop's).
pub(crate) fn preemptions(pid: u32) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("nonvoluntary_ctxt_switches:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}
