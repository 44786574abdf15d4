//! no-uring COMMAND [ARGS...]: runs COMMAND where io_uring is refused, the
//! way Docker's default seccomp profile refuses it.
//!
//! Installs a seccomp filter that fails `io_uring_setup`, `io_uring_enter`
//! and `io_uring_register` with EPERM and allows every other system call,
//! then executes COMMAND. The filter is inherited by every process COMMAND
//! starts, so `no-uring cargo test --all-targets` runs the whole suite as in
//! such a container (`scripts/no-uring.sh`). A test tool, not part of the
//! server.

#![deny(unsafe_code)]

use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let Some(program) = args.next() else {
        eprintln!("usage: no-uring COMMAND [ARGS...]");
        return ExitCode::from(2);
    };
    if let Err(e) = seccomp::refuse_io_uring() {
        eprintln!("no-uring: cannot install the seccomp filter: {e}");
        return ExitCode::FAILURE;
    }
    let e = Command::new(&program).args(args).exec();
    eprintln!("no-uring: cannot run {}: {e}", program.to_string_lossy());
    ExitCode::from(127)
}

// The two prctl calls are foreign functions, hence unsafe.
#[allow(unsafe_code)]
mod seccomp {
    use std::io;

    // linux/filter.h, linux/bpf_common.h, linux/seccomp.h, linux/audit.h.
    /// BPF_LD | BPF_W | BPF_ABS (0x00 | 0x00 | 0x20).
    const BPF_LD_W_ABS: u16 = 0x20;
    /// BPF_JMP | BPF_JEQ | BPF_K (0x05 | 0x10 | 0x00).
    const BPF_JMP_JEQ_K: u16 = 0x15;
    /// BPF_RET | BPF_K (0x06 | 0x00).
    const BPF_RET_K: u16 = 0x06;
    const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
    const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
    /// `struct seccomp_data`: `nr` at offset 0, `arch` at offset 4.
    const OFFSET_NR: u32 = 0;
    const OFFSET_ARCH: u32 = 4;
    #[cfg(target_arch = "x86_64")]
    const AUDIT_ARCH: u32 = 0xc000_003e;
    #[cfg(target_arch = "aarch64")]
    const AUDIT_ARCH: u32 = 0xc000_00b7;
    #[cfg(target_arch = "riscv64")]
    const AUDIT_ARCH: u32 = 0xc000_00f3;
    /// io_uring_setup, io_uring_enter, io_uring_register: the same numbers
    /// on every architecture.
    const IO_URING_SYSCALLS: [u32; 3] = [425, 426, 427];

    fn stmt(code: u16, k: u32) -> libc::sock_filter {
        libc::sock_filter {
            code,
            jt: 0,
            jf: 0,
            k,
        }
    }

    fn jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
        libc::sock_filter { code, jt, jf, k }
    }

    /// The filter: system calls of another architecture (the x32 ABI, say)
    /// and all but the three io_uring calls are allowed; those fail EPERM.
    pub(super) fn program() -> Vec<libc::sock_filter> {
        let eperm = SECCOMP_RET_ERRNO | libc::EPERM as u32;
        let mut p = vec![
            stmt(BPF_LD_W_ABS, OFFSET_ARCH),
            jump(BPF_JMP_JEQ_K, AUDIT_ARCH, 1, 0),
            stmt(BPF_RET_K, SECCOMP_RET_ALLOW),
            stmt(BPF_LD_W_ABS, OFFSET_NR),
        ];
        let n = IO_URING_SYSCALLS.len() as u8;
        for (i, nr) in IO_URING_SYSCALLS.into_iter().enumerate() {
            // Match: skip the rest of the tests and the ALLOW, to the ERRNO.
            p.push(jump(BPF_JMP_JEQ_K, nr, n - i as u8, 0));
        }
        p.push(stmt(BPF_RET_K, SECCOMP_RET_ALLOW));
        p.push(stmt(BPF_RET_K, eperm));
        p
    }

    /// Installs the filter on this thread (before any other is started),
    /// for this process and all it executes.
    pub(super) fn refuse_io_uring() -> io::Result<()> {
        let filter = program();
        let prog = libc::sock_fprog {
            len: filter.len() as u16,
            filter: filter.as_ptr().cast_mut(),
        };
        // SAFETY: PR_SET_NO_NEW_PRIVS takes integer arguments only. Needed
        // for an unprivileged process to install a filter; it only stops
        // execve from granting privileges (setuid bits), which tests do not
        // need.
        if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `prog` points to `filter`, a valid BPF program of `len`
        // instructions, both alive for the call; the kernel copies the
        // program before returning.
        let rc = unsafe {
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const libc::sock_fprog,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn jumps_land_on_the_errno_return() {
            let p = super::program();
            let errno_at = p.len() - 1;
            for (at, insn) in p.iter().enumerate().skip(4).take(3) {
                assert_eq!(at + 1 + usize::from(insn.jt), errno_at);
            }
        }
    }
}
