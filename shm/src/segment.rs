//! Shared mappings of files in `/dev/shm`, their names, and cleanup.

use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use memmap2::MmapRaw;

use crate::error::{Result, ShmError};

/// Directory that holds the segment files (tmpfs on Linux).
pub const SHM_DIR: &str = "/dev/shm";

/// Prefix of every file this crate creates, so leftovers are recognisable.
const PREFIX: &str = "ibcoll-";

/// Longest sanitized job id kept verbatim; longer ids are shortened with a
/// hash so names stay far below `NAME_MAX`.
const MAX_JOB_CHARS: usize = 64;

/// A shared, read-write mapping of one file in [`SHM_DIR`].
///
/// The mapping is released on drop; the file is not removed (see
/// [`Segment::unlink`]), because other ranks may still need to open it.
#[derive(Debug)]
pub struct Segment {
    map: MmapRaw,
    name: String,
}

impl Segment {
    /// Creates `SHM_DIR/name` exclusively (mode 0600), sizes it to `len`
    /// zero bytes and maps it shared.
    ///
    /// Fails with [`ShmError::Exists`] if the file is already there: a stale
    /// segment of a crashed job must be cleaned up, not silently reused.
    pub fn create(name: &str, len: usize) -> Result<Segment> {
        check_name(name)?;
        if len == 0 {
            return Err(ShmError::Invalid(format!("segment {name}: length 0")));
        }
        let path = path_of(name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| match e.kind() {
                io::ErrorKind::AlreadyExists => ShmError::Exists { name: name.into() },
                _ => seg_err(name, "create", e),
            })?;
        let mapped = file
            .set_len(len as u64)
            .map_err(|e| seg_err(name, "ftruncate", e))
            .and_then(|()| MmapRaw::map_raw(&file).map_err(|e| seg_err(name, "mmap", e)));
        match mapped {
            Ok(map) => Ok(Segment {
                map,
                name: name.into(),
            }),
            Err(e) => {
                // A half-made segment would make every later create fail.
                let _ = fs::remove_file(&path);
                Err(e)
            }
        }
    }

    /// Opens and maps an existing segment, checking its size.
    ///
    /// There is no retry: the caller must only open after the creator has
    /// finished [`Segment::create`] (e.g. after a PMI fence). A size other
    /// than `expected_len` gives [`ShmError::SizeMismatch`].
    pub fn open(name: &str, expected_len: usize) -> Result<Segment> {
        check_name(name)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path_of(name))
            .map_err(|e| seg_err(name, "open", e))?;
        let actual = file
            .metadata()
            .map_err(|e| seg_err(name, "fstat", e))?
            .len() as usize;
        if actual != expected_len {
            return Err(ShmError::SizeMismatch {
                name: name.into(),
                expected: expected_len,
                actual,
            });
        }
        let map = MmapRaw::map_raw(&file).map_err(|e| seg_err(name, "mmap", e))?;
        Ok(Segment {
            map,
            name: name.into(),
        })
    }

    /// Removes `SHM_DIR/name`. Existing mappings stay valid. Removing a
    /// segment that is already gone succeeds, so every rank may call it.
    pub fn unlink(name: &str) -> Result<()> {
        check_name(name)?;
        match fs::remove_file(path_of(name)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(seg_err(name, "unlink", e)),
        }
    }

    /// Start of the mapping (page aligned). Valid while `self` lives.
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// Length of the mapping in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Always false: zero-length segments cannot be created.
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// The segment's name (file name under [`SHM_DIR`]).
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Name of the node segment of `node_id` in job `job_id`:
/// `ibcoll-<sanitized job id>-n<node_id>`.
///
/// The job id keeps `[A-Za-z0-9_.]` and maps everything else (including `-`)
/// to `_`, so the `-` after it unambiguously ends it and [`cleanup_job`] of
/// job `a` never touches job `a-b`. Ids differing only in replaced
/// characters share names; ids over 64 characters are shortened with a hash.
pub fn segment_name(job_id: &str, node_id: usize) -> String {
    format!("{PREFIX}{}-n{node_id}", sanitize_job(job_id))
}

/// Removes every `SHM_DIR/ibcoll-<sanitized job_id>-*` file and returns how
/// many were removed. The launcher calls it when a job ends, so segments of
/// crashed ranks do not pile up in memory.
pub fn cleanup_job(job_id: &str) -> io::Result<usize> {
    let prefix = format!("{PREFIX}{}-", sanitize_job(job_id));
    let mut removed = 0;
    for entry in fs::read_dir(SHM_DIR)? {
        let entry = entry?;
        let matches = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(&prefix));
        if !matches {
            continue;
        }
        match fs::remove_file(entry.path()) {
            Ok(()) => removed += 1,
            // Another cleaner (or the creator) got there first.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(removed)
}

fn sanitize_job(job_id: &str) -> String {
    let clean: String = job_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean.is_empty() {
        return "_".into();
    }
    if clean.len() <= MAX_JOB_CHARS {
        return clean;
    }
    format!("{}_{:016x}", &clean[..MAX_JOB_CHARS - 17], fnv1a(job_id))
}

fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > 255 || name.contains('/') || name == "." || name == ".." {
        return Err(ShmError::Invalid(format!("bad segment name {name:?}")));
    }
    Ok(())
}

fn path_of(name: &str) -> PathBuf {
    PathBuf::from(SHM_DIR).join(name)
}

fn seg_err(name: &str, op: &'static str, source: io::Error) -> ShmError {
    ShmError::Segment {
        name: name.into(),
        op,
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_sanitized_and_unambiguous() {
        assert_eq!(segment_name("job42", 3), "ibcoll-job42-n3");
        assert_eq!(segment_name("a-b/c", 0), "ibcoll-a_b_c-n0");
        assert_eq!(segment_name("", 1), "ibcoll-_-n1");
        let long = "x".repeat(300);
        let n = segment_name(&long, 0);
        assert!(n.len() < 100, "{n}");
        assert_ne!(n, segment_name(&"x".repeat(301), 0));
        assert!(!sanitize_job("a-b").contains('-'));
    }

    #[test]
    fn rejects_bad_names() {
        assert!(matches!(
            Segment::create("a/b", 10),
            Err(ShmError::Invalid(_))
        ));
        assert!(matches!(Segment::open("..", 10), Err(ShmError::Invalid(_))));
    }
}
