//! A full disk, for real, in tests: the process's soft file-size limit (RLIMIT_FSIZE, SIGXFSZ
//! ignored) makes writes past it fail with EFBIG, as a full disk fails them with ENOSPC.
//! Process-wide, so one such test per test binary.
#![allow(dead_code)]

/// Lowers the soft file-size limit; the hard limit stays, so it can be raised back (`lift`, or
/// on drop).
pub struct FileSizeLimit(libc::rlimit);

impl FileSizeLimit {
    pub fn set(bytes: u64) -> FileSizeLimit {
        // SAFETY: plain getrlimit/setrlimit/signal calls on this process.
        unsafe {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let mut old: libc::rlimit = std::mem::zeroed();
            assert_eq!(libc::getrlimit(libc::RLIMIT_FSIZE, &mut old), 0);
            let new = libc::rlimit {
                rlim_cur: bytes,
                rlim_max: old.rlim_max,
            };
            assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &new), 0);
            FileSizeLimit(old)
        }
    }

    pub fn lift(&self) {
        // SAFETY: restores the limits read in `set`.
        unsafe {
            assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &self.0), 0);
        }
    }
}

impl Drop for FileSizeLimit {
    fn drop(&mut self) {
        self.lift();
    }
}
