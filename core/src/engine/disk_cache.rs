//! Compiled executables kept on disk across processes (`RTPU_CACHE_DIR`,
//! default `$XDG_CACHE_HOME/rtpu` or `~/.cache/rtpu`; empty disables it).
//!
//! An entry, `<key>.xla`, is named by a hash of everything its executable
//! depends on (rtpu's version, the plugin and its build, the compile
//! options, `XLA_FLAGS`, the program text) and holds a magic, a checksum,
//! the program text and the serialized executable. The checksum and the
//! text are checked before a byte reaches the plugin: corrupted machine
//! code would be run.
//! A bad entry warns, is recompiled and rewritten.
//!
//! Whoever can write the directory can run code in this process, so it is
//! made 0700 with 0600 files, and refused (the cache is then off, with a
//! warning) when another user owns it or others may write to it. Its size
//! is capped (`RTPU_CACHE_MAX_BYTES`, default 1 GiB): the entries used
//! least recently go first (loading an entry refreshes its time).

use std::collections::hash_map::DefaultHasher;
use std::fs::{DirBuilder, File, OpenOptions};
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::SystemTime;

use crate::runtime::{Client, CompileOptions, LoadedExecutable};

const MAGIC: &[u8; 8] = b"RTPUXLA2";
const CHECKSUM_BYTES: usize = 16;
const DEFAULT_MAX_BYTES: u64 = 1 << 30;
const ENTRY_SUFFIX: &str = "xla";

/// The cache directory as configured, or `None` when disabled
/// (`RTPU_CACHE_DIR=""`).
pub fn cache_dir() -> Option<PathBuf> {
    match std::env::var_os("RTPU_CACHE_DIR") {
        Some(dir) if dir.is_empty() => None,
        Some(dir) => Some(PathBuf::from(dir)),
        None => {
            let base = std::env::var_os("XDG_CACHE_HOME")
                .filter(|d| !d.is_empty())
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
            Some(base.join("rtpu"))
        }
    }
}

/// The size cap: `RTPU_CACHE_MAX_BYTES`, else 1 GiB.
pub fn max_bytes() -> u64 {
    static WARNED: AtomicBool = AtomicBool::new(false);
    env_count("RTPU_CACHE_MAX_BYTES", DEFAULT_MAX_BYTES, &WARNED)
}

/// Environment variable `name` as a whole number, else `default` (with one
/// warning when it is set to something else).
pub(super) fn env_count(name: &str, default: u64, warned: &AtomicBool) -> u64 {
    match std::env::var(name) {
        Err(_) => default,
        Ok(text) => text.trim().parse().unwrap_or_else(|_| {
            warn_once(
                warned,
                format!("{name}={text} is not a whole number; using {default}"),
            );
            default
        }),
    }
}

static DIR_WARNED: AtomicBool = AtomicBool::new(false);
static WRITE_WARNED: AtomicBool = AtomicBool::new(false);

fn warn_once(flag: &AtomicBool, message: String) {
    if !flag.swap(true, Ordering::Relaxed) {
        eprintln!("rtpu: {message}");
    }
}

/// The user this process runs as: the owner of its /proc entry.
fn current_uid() -> Option<u32> {
    std::fs::metadata("/proc/self").ok().map(|m| m.uid())
}

/// Creates the directory (0700) if needed and checks that only this user
/// can write to it; a directory of this user's is made 0700.
fn prepare(dir: &Path) -> std::io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let meta = std::fs::metadata(dir)?;
    if let Some(uid) = current_uid() {
        if meta.uid() != uid {
            return Err(std::io::Error::other(format!(
                "it is owned by user {}, not by this user ({uid})",
                meta.uid()
            )));
        }
    }
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// The cache directory when it is enabled and safe to use.
fn usable_dir() -> Option<PathBuf> {
    let dir = cache_dir()?;
    match prepare(&dir) {
        Ok(()) => Some(dir),
        Err(e) => {
            warn_once(
                &DIR_WARNED,
                format!(
                    "not using the compile cache at {}: {e} (set RTPU_CACHE_DIR to a directory \
                     of your own, or to an empty value to disable it)",
                    dir.display()
                ),
            );
            None
        }
    }
}

/// Everything an entry's name is derived from: an executable is reused only
/// when all of it matches (a new rtpu, plugin, plugin build, compile option
/// or XLA flag must miss, not load a stale executable).
#[derive(Hash)]
struct DiskKey<'a> {
    rtpu_version: &'a str,
    plugin: &'a Path,
    platform_version: &'a str,
    options: &'a CompileOptions,
    xla_flags: &'a str,
    text: &'a str,
}

/// `XLA_FLAGS` as the plugin compiles under it: XLA reads the variable once,
/// when it first needs its options, so a later change in this process
/// changes neither. Unset is the same as empty.
fn xla_flags() -> &'static str {
    static FLAGS: OnceLock<String> = OnceLock::new();
    FLAGS.get_or_init(|| std::env::var("XLA_FLAGS").unwrap_or_default())
}

/// 128 bits from two seeded 64-bit hashes (SipHash) of `value`: a
/// checksum that catches corruption, not a forger.
pub fn hash128(value: &impl Hash) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (seed, half) in out.chunks_exact_mut(8).enumerate() {
        let mut h = DefaultHasher::new();
        seed.hash(&mut h);
        value.hash(&mut h);
        half.copy_from_slice(&h.finish().to_le_bytes());
    }
    out
}

impl DiskKey<'_> {
    fn file_name(&self) -> String {
        let hex: String = hash128(self).iter().map(|b| format!("{b:02x}")).collect();
        format!("{hex}.{ENTRY_SUFFIX}")
    }
}

/// One entry of the disk cache.
pub(crate) struct DiskEntry {
    path: PathBuf,
}

impl DiskEntry {
    /// The entry for `text` compiled with `options` by `client`; `None` when
    /// the cache is off or its directory is refused.
    pub(crate) fn new(client: &Client, options: &CompileOptions, text: &str) -> Option<DiskEntry> {
        let dir = usable_dir()?;
        let platform_version = client.platform_version().unwrap_or_default();
        let key = DiskKey {
            rtpu_version: env!("CARGO_PKG_VERSION"),
            plugin: client.plugin().path(),
            platform_version: &platform_version,
            options,
            xla_flags: xla_flags(),
            text,
        };
        Some(DiskEntry {
            path: dir.join(key.file_name()),
        })
    }

    /// The stored executable, or `None` when there is none (or an entry of
    /// an older format); a corrupt entry warns and is `None`, so the caller
    /// compiles and stores it again.
    pub(crate) fn load(&self, client: &Client, text: &str) -> Option<LoadedExecutable> {
        let bytes = std::fs::read(&self.path).ok()?;
        let body = bytes.strip_prefix(MAGIC.as_slice())?;
        let exe = match check(body, text) {
            Ok(payload) => client.deserialize(payload).map_err(|e| e.to_string()),
            Err(reason) => Err(reason),
        };
        match exe {
            Ok(exe) => {
                // Least recently used goes first: a load counts as a use.
                let _ = File::options()
                    .write(true)
                    .open(&self.path)
                    .and_then(|f| f.set_modified(SystemTime::now()));
                Some(exe)
            }
            Err(reason) => {
                eprintln!(
                    "rtpu: the compile cache entry {} is corrupt ({reason}); recompiling it",
                    self.path.display()
                );
                None
            }
        }
    }

    /// Writes the entry (0600, written aside and renamed so a reader never
    /// sees half a file), then evicts past the size cap. Best effort: a
    /// cache that cannot be written only costs a compile next time.
    pub(crate) fn store(&self, text: &str, exe: &LoadedExecutable) {
        let write = || -> std::io::Result<()> {
            let payload = exe
                .serialize()
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            let mut bytes =
                Vec::with_capacity(MAGIC.len() + CHECKSUM_BYTES + 8 + text.len() + payload.len());
            bytes.extend_from_slice(MAGIC);
            bytes.extend_from_slice(&checksum(text.as_bytes(), &payload));
            bytes.extend_from_slice(&(text.len() as u64).to_le_bytes());
            bytes.extend_from_slice(text.as_bytes());
            bytes.extend_from_slice(&payload);
            let partial = self
                .path
                .with_extension(format!("partial.{}", std::process::id()));
            let mut file = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&partial)?;
            file.write_all(&bytes)?;
            drop(file);
            std::fs::rename(&partial, &self.path)
        };
        if let Err(e) = write() {
            warn_once(
                &WRITE_WARNED,
                format!(
                    "cannot write the compile cache at {}: {e} (set RTPU_CACHE_DIR to another \
                     directory, or to an empty value to disable it)",
                    self.path.display()
                ),
            );
            return;
        }
        if let Some(dir) = self.path.parent() {
            evict(dir, max_bytes());
        }
    }
}

fn checksum(text: &[u8], payload: &[u8]) -> [u8; CHECKSUM_BYTES] {
    hash128(&(text, payload))
}

/// The payload of an entry's body (after the magic) whose checksum and
/// program text hold, or why not.
fn check<'b>(body: &'b [u8], text: &str) -> Result<&'b [u8], String> {
    let truncated = || "truncated".to_string();
    let (sum, rest) = body
        .split_at_checked(CHECKSUM_BYTES)
        .ok_or_else(truncated)?;
    let (len, rest) = rest.split_at_checked(8).ok_or_else(truncated)?;
    let len = u64::from_le_bytes(len.try_into().map_err(|_| truncated())?);
    let len = usize::try_from(len).map_err(|_| truncated())?;
    let (stored_text, payload) = rest.split_at_checked(len).ok_or_else(truncated)?;
    if checksum(stored_text, payload).as_slice() != sum {
        return Err("its checksum does not match".to_string());
    }
    if stored_text != text.as_bytes() {
        return Err("it holds another program".to_string());
    }
    Ok(payload)
}

/// The entries of `dir` with their sizes and last-use times.
fn entries(dir: &Path) -> Vec<(PathBuf, u64, SystemTime)> {
    let Ok(read) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    read.filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == ENTRY_SUFFIX))
        .filter_map(|e| {
            let meta = e.metadata().ok()?;
            Some((e.path(), meta.len(), meta.modified().ok()?))
        })
        .collect()
}

/// Removes the least recently used entries until `dir` holds at most
/// `max_bytes`. One process at a time evicts.
fn evict(dir: &Path, max_bytes: u64) {
    static EVICTING: Mutex<()> = Mutex::new(());
    let _one = EVICTING.lock().unwrap_or_else(|p| p.into_inner());
    let mut all = entries(dir);
    let mut total: u64 = all.iter().map(|(_, size, _)| size).sum();
    all.sort_by_key(|(_, _, used)| *used);
    for (path, size, _) in all {
        if total <= max_bytes {
            break;
        }
        if std::fs::remove_file(&path).is_ok() {
            total -= size;
        }
    }
}

/// What the disk cache holds now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheInfo {
    /// The directory, when the cache is on and the directory usable.
    pub dir: Option<PathBuf>,
    pub entries: u64,
    pub bytes: u64,
    pub max_bytes: u64,
}

pub fn info() -> CacheInfo {
    let dir = usable_dir();
    let all = dir.as_deref().map(entries).unwrap_or_default();
    CacheInfo {
        entries: all.len() as u64,
        bytes: all.iter().map(|(_, size, _)| size).sum(),
        max_bytes: max_bytes(),
        dir,
    }
}

/// Removes every entry; returns how many.
pub fn clear() -> u64 {
    let Some(dir) = usable_dir() else {
        return 0;
    };
    entries(&dir)
        .into_iter()
        .filter(|(path, _, _)| std::fs::remove_file(path).is_ok())
        .count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_part_of_the_disk_key_changes_the_entry() {
        let options = CompileOptions::default();
        let spmd = CompileOptions {
            num_partitions: 4,
            use_spmd_partitioning: true,
            ..CompileOptions::default()
        };
        let base = DiskKey {
            rtpu_version: "2.11.0",
            plugin: Path::new("/plugins/xla_cpu_pjrt.so"),
            platform_version: "cpu 0.81",
            options: &options,
            xla_flags: "",
            text: "module @m {}",
        };
        let variants = [
            DiskKey {
                rtpu_version: "2.11.1",
                ..base
            },
            DiskKey {
                plugin: Path::new("/plugins/other.so"),
                ..base
            },
            DiskKey {
                platform_version: "cpu 0.82",
                ..base
            },
            DiskKey {
                options: &spmd,
                ..base
            },
            DiskKey {
                xla_flags: "--xla_cpu_enable_fast_math=true",
                ..base
            },
            DiskKey {
                text: "module @n {}",
                ..base
            },
        ];
        let mut names: Vec<String> = variants.iter().map(DiskKey::file_name).collect();
        names.push(base.file_name());
        assert_eq!(
            base.file_name(),
            base.file_name(),
            "the name is deterministic"
        );
        let count = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), count, "each changed part gives another entry");
    }

    #[test]
    fn a_flipped_bit_truncation_or_another_program_is_refused() {
        let text = "module @m {}";
        let payload = b"executable bytes";
        let mut body = checksum(text.as_bytes(), payload).to_vec();
        body.extend_from_slice(&(text.len() as u64).to_le_bytes());
        body.extend_from_slice(text.as_bytes());
        body.extend_from_slice(payload);
        assert_eq!(check(&body, text), Ok(payload.as_slice()));
        for bit in [0, 8 * CHECKSUM_BYTES + 3, 8 * body.len() - 1] {
            let mut flipped = body.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(check(&flipped, text).is_err(), "bit {bit}");
        }
        for len in [0, CHECKSUM_BYTES + 4, body.len() - 1] {
            assert!(check(&body[..len], text).is_err(), "truncated to {len}");
        }
        assert_eq!(
            check(&body, "module @other {}"),
            Err("it holds another program".to_string())
        );
    }
}
