//! A caching allocator for the large host blocks of XLA's CPU plugin.
//!
//! On the CPU plugin device memory is host memory: every buffer and every
//! run's temporary comes from the plugin's `posix_memalign` (or
//! `aligned_alloc`), its dots' packing blocks from `malloc`, and all go
//! back through its `free`. glibc serves a block above 32 MiB with a fresh
//! `mmap` and unmaps it at `free`, so a program with a 90 MiB temporary
//! page-faults all of it in again on every run: a GPT training step here
//! took ~22k page faults, ~30 ms of its ~260. GLIBC's
//! tunables would fix it, but only for the whole process and only when set
//! before it starts. CUDA's caching allocator answers the same problem for
//! GPUs by keeping freed blocks for the next request, and so does this
//! module, for the plugin alone: `install` points the plugin's own GOT
//! entries for those functions at the ones below. Nothing else in the process
//! changes allocator, and a plugin whose GOT holds none of them is left as is.
//!
//! Blocks of at least `MIN_CACHED_BYTES` are tracked while the plugin holds
//! them, however many; a freed one is kept (up to `RTPU_HOST_CACHE_MAX_BYTES`, default
//! 1 GiB, oldest given back first) and handed out again for a request it
//! fits closely; one that no request claims while 256 later ones are kept goes
//! back too, and so does one a slightly larger request outgrows (see `take`).
//! `release` frees every kept block (`torch.tpu.empty_cache()`).
//! Every large block is a genuine glibc allocation, so one freed by another
//! path stays valid memory; see `untrack`.
//!
//! The plugin's smaller aligned blocks come from mimalloc instead (librtpu's
//! own allocator): glibc serves an aligned request by carving a larger
//! chunk and freeing its ends, ~650 instructions for each of the five
//! aligned blocks an eager op's launch asks for (its output buffer and the
//! plugin's 64-byte-aligned bookkeeping, `operator new` with an alignment),
//! and more to free them; mimalloc takes ~60. So do the ~28 small blocks of
//! plain `operator new` a launch makes (glibc ~150 instructions a pair,
//! mimalloc ~45). They go back through the same GOT entries (`free`,
//! `realloc`, every `operator delete`), which give mimalloc what is its
//! (`mi_is_in_heap_region`) and glibc or the C++ runtime the rest, so a
//! block the plugin got before `install` or through another path is freed
//! where it came from. The C++ runtime's own `delete`s check the same way:
//! its out-of-line code frees blocks the plugin's inline code made.

use std::collections::BTreeMap;
use std::ffi::{c_int, c_void, CStr};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::metrics::{self, Metric};

/// Smaller blocks are left to glibc, whose heaps already reuse them.
const MIN_CACHED_BYTES: usize = 4 << 20;

/// A kept block serves a smaller request when it is larger by at most the
/// request over this: XLA's packing blocks differ a little in size from dot
/// to dot, and a cache of exact sizes kept one of each.
const FIT_SLACK: usize = 4;

/// The alignment glibc's `malloc` gives every block on 64-bit systems.
const MALLOC_ALIGN: usize = 16;

/// `free` sorts pointers into this many buckets by their window of
/// `MIN_CACHED_BYTES`. Two live tracked blocks, each at least that long,
/// start in different windows; a bucket counts the live ones that start in
/// its windows.
const BUCKETS: usize = 4096;

/// The environment variable capping the bytes kept; 0 turns the cache off.
pub const MAX_BYTES_ENV: &str = "RTPU_HOST_CACHE_MAX_BYTES";
const DEFAULT_MAX_BYTES: usize = 1 << 30;

/// A large block: its address, the size the plugin asked for, and the
/// alignment it was allocated with.
#[derive(Clone, Copy)]
struct Block {
    ptr: *mut c_void,
    size: usize,
    align: usize,
}

// SAFETY: a block is plain memory owned by whoever holds the `Block`; moving
// the address between threads is what `free` from another thread does.
unsafe impl Send for Block {}

/// The large blocks the plugin holds now, by address. `free` is called for
/// every block the plugin frees, small ones included, so it first reads the
/// pointer's bucket count: zero (the usual case) means not one of them,
/// without taking the lock.
struct Live {
    blocks: Mutex<BTreeMap<usize, Block>>,
    per_bucket: [AtomicU32; BUCKETS],
}

static LIVE: Live = Live {
    blocks: Mutex::new(BTreeMap::new()),
    per_bucket: [const { AtomicU32::new(0) }; BUCKETS],
};

fn bucket(ptr: *mut c_void) -> &'static AtomicU32 {
    &LIVE.per_bucket[(ptr as usize / MIN_CACHED_BYTES) % BUCKETS]
}

fn lock<T>(mutex: &'static Mutex<T>) -> std::sync::MutexGuard<'static, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A kept block goes back to glibc once this many other blocks were kept
/// after it without one request claiming it: a training loop asks for the
/// same sizes every step, and a size seen once (the first step's program,
/// say) should not hold memory for the rest of the run. A GPT step (d =
/// 512) keeps ~35 blocks, most of them XLA's packing blocks: a window of 16
/// gave most of them back between steps.
const KEPT_WINDOW: u64 = 256;

/// Freed blocks kept for reuse, oldest first, each with the `kept` count
/// at which it came; their total size.
struct Kept {
    blocks: Vec<(Block, u64)>,
    bytes: usize,
    kept: u64,
}

impl Kept {
    /// Takes the `i`th kept block out of the cache.
    fn remove(&mut self, i: usize) -> Block {
        let (block, _) = self.blocks.remove(i);
        self.bytes -= block.size;
        metrics::sub(Metric::HostCacheBytes, block.size as u64);
        block
    }
}

static KEPT: Mutex<Kept> = Mutex::new(Kept {
    blocks: Vec::new(),
    bytes: 0,
    kept: 0,
});

fn max_bytes() -> usize {
    static MAX: OnceLock<usize> = OnceLock::new();
    *MAX.get_or_init(|| {
        std::env::var(MAX_BYTES_ENV)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(DEFAULT_MAX_BYTES)
    })
}

/// A block of `size` bytes aligned to `align` (a power of two, at least a
/// pointer): the smallest kept one of that alignment that holds `size` and
/// is larger by at most `size / FIT_SLACK`, or a new one.
///
/// A new one first gives back the largest kept block of that alignment the
/// request just outgrew (smaller than `size` by at most `size /
/// FIT_SLACK`): most likely the same buffer of an earlier program, such as
/// the first training step's, whose temporary (627 MiB for a GPT at T =
/// 512) is a little smaller than the next step's. Kept, it stayed beside
/// its successor until the window let it go: the second step's resident
/// memory rose by its size. A block goes back this way only for a larger
/// request, so requests of two sizes taking turns settle within a few
/// rounds: the larger block then serves both, or each size keeps its own.
fn take(size: usize, align: usize) -> *mut c_void {
    let (reused, outgrown) = {
        let mut kept = lock(&KEPT);
        let fits =
            |b: &Block| b.align == align && b.size >= size && b.size - size <= size / FIT_SLACK;
        let outgrown =
            |b: &Block| b.align == align && b.size < size && size - b.size <= size / FIT_SLACK;
        // Of equal fits the most recently freed: its pages are the warmest.
        let fitting = kept
            .blocks
            .iter()
            .enumerate()
            .rev()
            .filter(|(_, (b, _))| fits(b))
            .min_by_key(|(_, (b, _))| b.size)
            .map(|(i, _)| i);
        match fitting {
            Some(i) => (Some(kept.remove(i)), None),
            None => {
                let largest_outgrown = kept
                    .blocks
                    .iter()
                    .enumerate()
                    .filter(|(_, (b, _))| outgrown(b))
                    .max_by_key(|(_, (b, _))| b.size)
                    .map(|(i, _)| i);
                (None, largest_outgrown.map(|i| kept.remove(i)))
            }
        }
    };
    if let Some(block) = outgrown {
        // SAFETY: a kept block, a glibc allocation nobody else holds.
        unsafe { libc::free(block.ptr) };
    }
    let block = match reused {
        Some(block) => {
            metrics::add(Metric::HostCacheReuses, 1);
            block
        }
        None => {
            let mut ptr = std::ptr::null_mut();
            // SAFETY: `align` is a power of two and a multiple of a pointer's
            // size, as posix_memalign requires.
            if unsafe { libc::posix_memalign(&mut ptr, align, size) } != 0 {
                return std::ptr::null_mut();
            }
            Block { ptr, size, align }
        }
    };
    track(block);
    block.ptr
}

fn track(block: Block) {
    let mut live = lock(&LIVE.blocks);
    // An entry already there is stale (see `untrack`) and already counted.
    if live.insert(block.ptr as usize, block).is_none() {
        bucket(block.ptr).fetch_add(1, Ordering::Release);
    }
}

/// The tracked block at `ptr`, no longer tracked; `None` when `ptr` is not
/// one. A tracked block freed by a path that bypassed the plugin's GOT (then
/// the address reused by glibc) would leave a stale entry; `malloc_usable_size`
/// catches a reuse smaller than the entry, and a larger one is safe to keep
/// as a block of the entry's size.
fn untrack(ptr: *mut c_void) -> Option<Block> {
    if ptr.is_null() || bucket(ptr).load(Ordering::Acquire) == 0 {
        return None;
    }
    let block = lock(&LIVE.blocks).remove(&(ptr as usize))?;
    bucket(ptr).fetch_sub(1, Ordering::Release);
    // SAFETY: `ptr` is a live glibc allocation: the plugin is freeing it.
    let usable = unsafe { libc::malloc_usable_size(ptr) };
    (usable >= block.size).then_some(block)
}

/// Keeps a freed block, giving back the oldest kept ones past the cap or
/// past `KEPT_WINDOW`.
fn keep(block: Block) {
    let max = max_bytes();
    if block.size > max {
        // SAFETY: the plugin gave the block up; it is a glibc allocation.
        unsafe { libc::free(block.ptr) };
        return;
    }
    let mut given_back = Vec::new();
    {
        let mut kept = lock(&KEPT);
        kept.kept += 1;
        let now = kept.kept;
        kept.blocks.push((block, now));
        kept.bytes += block.size;
        metrics::add(Metric::HostCacheBytes, block.size as u64);
        // The block just kept is neither over the cap alone (see above) nor
        // out of the window, so the loop stops before it.
        while kept.bytes > max
            || kept
                .blocks
                .first()
                .is_some_and(|(_, at)| at + KEPT_WINDOW < now)
        {
            given_back.push(kept.remove(0));
        }
    }
    for block in given_back {
        // SAFETY: kept blocks are glibc allocations nobody else holds.
        unsafe { libc::free(block.ptr) };
    }
}

/// Frees every kept block; returns the bytes given back.
pub fn release() -> u64 {
    let blocks = {
        let mut kept = lock(&KEPT);
        kept.bytes = 0;
        std::mem::take(&mut kept.blocks)
    };
    let mut bytes = 0;
    for (block, _) in blocks {
        bytes += block.size as u64;
        // SAFETY: as in `keep`.
        unsafe { libc::free(block.ptr) };
    }
    metrics::sub(Metric::HostCacheBytes, bytes);
    bytes
}

// mimalloc's ownership test (its "extended" API, which the Rust bindings
// gate behind a feature needing another crate; the function is in the
// library either way).
extern "C" {
    fn mi_is_in_heap_region(ptr: *const c_void) -> bool;
}

/// Whether `ptr` is a block mimalloc handed out (null is not).
fn from_mimalloc(ptr: *const c_void) -> bool {
    // SAFETY: only compares the address with mimalloc's reserved regions.
    !ptr.is_null() && unsafe { mi_is_in_heap_region(ptr) }
}

/// A small block from mimalloc, aligned to `align` (a power of two); null
/// when it has no memory. mimalloc's blocks are 8-byte aligned, and 16-byte
/// aligned from 16 bytes up (the only sizes above 8 its size classes hold),
/// so the plain call serves most requests: the aligned one took ~20 more
/// instructions for each of the plain `new`s of a launch.
fn small_block(size: usize, align: usize) -> *mut c_void {
    let size = size.max(1);
    let plain_call_aligns = align <= 8 || (align <= 16 && size > 8);
    // SAFETY: `align` is a power of two; a size of 0 still gets a unique
    // block, as glibc gives.
    unsafe {
        match plain_call_aligns {
            true => libmimalloc_sys::mi_malloc(size),
            false => libmimalloc_sys::mi_malloc_aligned(size, align),
        }
    }
}

// The plugin's allocation functions, once `install` has redirected them.

extern "C" fn cached_posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
    let valid_align = align.is_power_of_two() && align % std::mem::size_of::<usize>() == 0;
    if !valid_align {
        // SAFETY: the plugin's own arguments: glibc returns EINVAL.
        return unsafe { libc::posix_memalign(out, align, size) };
    }
    let ptr = match size < MIN_CACHED_BYTES {
        true => small_block(size, align),
        false => take(size, align),
    };
    if ptr.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: posix_memalign's contract: `out` is writable.
    unsafe { out.write(ptr) };
    0
}

/// XLA's worker threads take their dots' packing blocks (4-7 MiB for a
/// GPT's layers) with plain `malloc`: large ones are cached as well, with
/// `malloc`'s alignment.
extern "C" fn cached_malloc(size: usize) -> *mut c_void {
    match size < MIN_CACHED_BYTES {
        // SAFETY: the plugin's own argument, passed through unchanged.
        true => unsafe { libc::malloc(size) },
        false => take(size, MALLOC_ALIGN),
    }
}

extern "C" fn cached_aligned_alloc(align: usize, size: usize) -> *mut c_void {
    if !align.is_power_of_two() {
        // SAFETY: the plugin's own arguments, passed through unchanged.
        return unsafe { libc::aligned_alloc(align, size) };
    }
    match size < MIN_CACHED_BYTES {
        true => small_block(size, align),
        false => take(size, align.max(std::mem::size_of::<usize>())),
    }
}

extern "C" fn cached_free(ptr: *mut c_void) {
    if from_mimalloc(ptr) {
        // SAFETY: a block mimalloc handed out, which the plugin gives up.
        return unsafe { libmimalloc_sys::mi_free(ptr) };
    }
    match untrack(ptr) {
        Some(block) => keep(block),
        // SAFETY: the plugin frees what it allocated; null is allowed.
        None => unsafe { libc::free(ptr) },
    }
}

extern "C" fn cached_realloc(ptr: *mut c_void, size: usize) -> *mut c_void {
    if from_mimalloc(ptr) {
        // SAFETY: a live mimalloc block of the plugin's.
        return unsafe { libmimalloc_sys::mi_realloc(ptr, size) };
    }
    // A tracked block changes hands to glibc's realloc, which may free it.
    untrack(ptr);
    // SAFETY: the plugin's own arguments, passed through unchanged.
    unsafe { libc::realloc(ptr, size) }
}

/// The C++ runtime function `name` the plugin would have called: the
/// process's global one (a sanitizer's where one intercepts it), else that
/// of the libstdc++ the plugin loaded, which a plugin opened RTLD_LOCAL
/// keeps out of the global scope (a Rust-only process).
fn runtime_function(name: &CStr) -> *mut c_void {
    // SAFETY: looks up a symbol by its NUL-terminated name.
    let global = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    if !global.is_null() {
        return global;
    }
    // SAFETY: RTLD_NOLOAD only finds a library already loaded; the handle's
    // reference is kept (libstdc++ stays loaded with the plugin anyway).
    let cxx = unsafe {
        libc::dlopen(
            c"libstdc++.so.6".as_ptr(),
            libc::RTLD_LAZY | libc::RTLD_NOLOAD,
        )
    };
    if cxx.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: as above, in that library.
    unsafe { libc::dlsym(cxx, name.as_ptr()) }
}

/// `$name`: a replacement for the C++ runtime's allocation function
/// `$symbol`, which takes the size and then `$arg`: a block under
/// `MIN_CACHED_BYTES` comes from mimalloc, aligned to `$align`; a larger
/// one, or any when mimalloc has no memory, from the runtime's own
/// function, which throws as it would have (through this frame:
/// "C-unwind") or, for a nothrow variant, returns null.
macro_rules! small_new {
    ($name:ident, $symbol:literal, ($($arg:ident: $ty:ty),*), $align:expr) => {
        extern "C-unwind" fn $name(size: usize $(, $arg: $ty)*) -> *mut c_void {
            if size < MIN_CACHED_BYTES {
                let ptr = small_block(size, $align);
                if !ptr.is_null() {
                    return ptr;
                }
            }
            type Runtime = unsafe extern "C-unwind" fn(usize $(, $ty)*) -> *mut c_void;
            static FOUND: OnceLock<Option<Runtime>> = OnceLock::new();
            let found = FOUND.get_or_init(|| {
                let f = runtime_function($symbol);
                // SAFETY: the symbol is that operator, with this signature.
                (!f.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, Runtime>(f) })
            });
            match found {
                // SAFETY: the caller's own arguments, passed to the operator it called.
                Some(new) => unsafe { new(size $(, $arg)*) },
                None => std::ptr::null_mut(),
            }
        }
    };
}

/// `$name`: a replacement for the C++ runtime's deallocation function
/// `$symbol`, which takes the block and then `$arg`: a block mimalloc
/// handed out goes back to mimalloc, any other to the runtime's function.
macro_rules! checked_delete {
    ($name:ident, $symbol:literal, ($($arg:ident: $ty:ty),*)) => {
        extern "C" fn $name(ptr: *mut c_void $(, $arg: $ty)*) {
            if from_mimalloc(ptr) {
                // SAFETY: a block mimalloc handed out, which its holder gives up.
                return unsafe { libmimalloc_sys::mi_free(ptr) };
            }
            type Runtime = unsafe extern "C" fn(*mut c_void $(, $ty)*);
            static FOUND: OnceLock<Option<Runtime>> = OnceLock::new();
            let found = FOUND.get_or_init(|| {
                let f = runtime_function($symbol);
                // SAFETY: the symbol is that operator, with this signature.
                (!f.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, Runtime>(f) })
            });
            if let Some(delete) = found {
                // SAFETY: a block of the runtime's `new` (made before
                // `install`, by other code, or when mimalloc had no memory),
                // given back to it.
                unsafe { delete(ptr $(, $arg)*) }
            }
        }
    };
}

// Plain `new` and `new[]` align to 16 bytes (__STDCPP_DEFAULT_NEW_ALIGNMENT__).
small_new!(small_new, c"_Znwm", (), 16);
small_new!(small_new_nothrow, c"_ZnwmRKSt9nothrow_t", (nothrow: *const c_void), 16);
small_new!(small_new_array, c"_Znam", (), 16);
small_new!(small_new_array_nothrow, c"_ZnamRKSt9nothrow_t", (nothrow: *const c_void), 16);
small_new!(small_aligned_new, c"_ZnwmSt11align_val_t", (align: usize), align);
small_new!(
    small_aligned_new_nothrow,
    c"_ZnwmSt11align_val_tRKSt9nothrow_t",
    (align: usize, nothrow: *const c_void),
    align
);
checked_delete!(checked_delete, c"_ZdlPv", ());
checked_delete!(checked_delete_nothrow, c"_ZdlPvRKSt9nothrow_t", (nothrow: *const c_void));
checked_delete!(checked_delete_sized, c"_ZdlPvm", (size: usize));
checked_delete!(checked_delete_array, c"_ZdaPv", ());
checked_delete!(checked_delete_aligned, c"_ZdlPvSt11align_val_t", (align: usize));
checked_delete!(checked_delete_array_aligned, c"_ZdaPvSt11align_val_t", (align: usize));
checked_delete!(
    checked_delete_sized_aligned,
    c"_ZdlPvmSt11align_val_t",
    (size: usize, align: usize)
);

/// The deallocation functions redirected, by their symbols: in the plugin,
/// and in the C++ runtime's own code, which frees what the plugin's inline
/// code allocated (a string it grows out of line, a facet it deletes).
fn checked_delete_for(name: &[u8]) -> Option<*const ()> {
    Some(match name {
        b"_ZdlPv" => checked_delete as *const (),
        b"_ZdlPvRKSt9nothrow_t" => checked_delete_nothrow as *const (),
        b"_ZdlPvm" => checked_delete_sized as *const (),
        b"_ZdaPv" => checked_delete_array as *const (),
        b"_ZdlPvSt11align_val_t" => checked_delete_aligned as *const (),
        b"_ZdaPvSt11align_val_t" => checked_delete_array_aligned as *const (),
        b"_ZdlPvmSt11align_val_t" => checked_delete_sized_aligned as *const (),
        _ => return None,
    })
}

/// The plugin's functions redirected whatever its C++ runtime: the C
/// allocator's, the over-aligned `new`s and every `delete`.
fn plugin_replacement(name: &[u8]) -> Option<usize> {
    let f: *const () = match name {
        b"malloc" => cached_malloc as *const (),
        b"posix_memalign" => cached_posix_memalign as *const (),
        b"aligned_alloc" => cached_aligned_alloc as *const (),
        b"free" => cached_free as *const (),
        b"realloc" => cached_realloc as *const (),
        b"_ZnwmSt11align_val_t" => small_aligned_new as *const (),
        b"_ZnwmSt11align_val_tRKSt9nothrow_t" => small_aligned_new_nothrow as *const (),
        _ => checked_delete_for(name)?,
    };
    Some(f as usize)
}

/// The plugin's plain `new`s: redirected only once the C++ runtime's own
/// `delete`s check for mimalloc's blocks.
fn plugin_plain_new_replacement(name: &[u8]) -> Option<usize> {
    let f: *const () = match name {
        b"_Znwm" => small_new as *const (),
        b"_ZnwmRKSt9nothrow_t" => small_new_nothrow as *const (),
        b"_Znam" => small_new_array as *const (),
        b"_ZnamRKSt9nothrow_t" => small_new_array_nothrow as *const (),
        _ => return None,
    };
    Some(f as usize)
}

fn runtime_replacement(name: &[u8]) -> Option<usize> {
    checked_delete_for(name).map(|f| f as usize)
}

/// Whether a loaded object is a C++ runtime, by its file name.
fn is_cxx_runtime(object: &Path) -> bool {
    object
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("libstdc++.so") || n.starts_with("libc++.so"))
}

/// Points the GOT entries of the loaded library at `path` for the functions
/// above at this module's, and the C++ runtime's own `delete`s at the
/// checking ones. Returns how many of the plugin's entries now point here;
/// 0 when the cache is off (`RTPU_HOST_CACHE_MAX_BYTES=0`), on other
/// systems, or when the library imports none of them. Idempotent.
pub fn install(path: &Path) -> usize {
    if max_bytes() == 0 {
        return 0;
    }
    let Ok(plugin) = path.canonicalize() else {
        return 0;
    };
    // The loader names a plugin by the path it was opened with, and plugins
    // are opened by their canonical path.
    let is_plugin = |object: &Path| object == plugin;
    let mut patched = got::patch(&is_plugin, plugin_replacement);
    // A block of the plugin's plain `new` may be freed by the C++ runtime's
    // out-of-line code (a string grown by `std::string::reserve`), which
    // must then know it for mimalloc's: the plugin's inline code makes ~28
    // such blocks per launch, and glibc's `new` and `delete` cost ~150
    // instructions a pair against mimalloc's ~45.
    if got::patch(&is_cxx_runtime, runtime_replacement) > 0 {
        patched += got::patch(&is_plugin, plugin_plain_new_replacement);
    }
    patched
}

#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
mod got {
    //! Finding and rewriting a loaded library's GOT entries, from its
    //! dynamic section in memory (`dl_iterate_phdr`).

    use super::*;

    const DT_NULL: i64 = 0;
    const DT_PLTRELSZ: i64 = 2;
    const DT_STRTAB: i64 = 5;
    const DT_SYMTAB: i64 = 6;
    const DT_RELA: i64 = 7;
    const DT_RELASZ: i64 = 8;
    const DT_JMPREL: i64 = 23;

    #[cfg(target_arch = "x86_64")]
    const SLOT_RELOCATIONS: [u32; 2] = [6, 7]; // R_X86_64_GLOB_DAT, R_X86_64_JUMP_SLOT
    #[cfg(target_arch = "aarch64")]
    const SLOT_RELOCATIONS: [u32; 2] = [1025, 1026]; // R_AARCH64_GLOB_DAT, R_AARCH64_JUMP_SLOT
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    const SLOT_RELOCATIONS: [u32; 0] = [];

    #[repr(C)]
    struct Dyn {
        tag: i64,
        value: u64,
    }

    #[repr(C)]
    struct Rela {
        offset: u64,
        info: u64,
        addend: i64,
    }

    #[repr(C)]
    struct Sym {
        name: u32,
        info: u8,
        other: u8,
        section: u16,
        value: u64,
        size: u64,
    }

    struct Search<'a> {
        matches: &'a dyn Fn(&Path) -> bool,
        replacement: fn(&[u8]) -> Option<usize>,
        patched: usize,
    }

    /// Patches every loaded object whose name `matches`; returns how many
    /// GOT entries now point at a replacement.
    pub(super) fn patch(
        matches: &dyn Fn(&Path) -> bool,
        replacement: fn(&[u8]) -> Option<usize>,
    ) -> usize {
        let mut search = Search {
            matches,
            replacement,
            patched: 0,
        };
        // SAFETY: the callback only reads the loader's structures for the
        // duration of the call and gets `search` back as its data.
        unsafe { libc::dl_iterate_phdr(Some(visit), (&mut search as *mut Search).cast()) };
        search.patched
    }

    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: `data` is the `Search` passed to dl_iterate_phdr, `info`
        // the loader's description of one loaded object.
        let (search, info) = unsafe { (&mut *data.cast::<Search>(), &*info) };
        if info.dlpi_name.is_null() {
            return 0;
        }
        // SAFETY: the loader's NUL-terminated name of the object.
        let name = unsafe { CStr::from_ptr(info.dlpi_name) };
        if std::str::from_utf8(name.to_bytes()).is_ok_and(|n| (search.matches)(Path::new(n))) {
            // SAFETY: the object is loaded and stays loaded (plugins and
            // the C++ runtime are never unloaded); its headers are the
            // loader's.
            search.patched += unsafe { patch_object(info, search.replacement) };
        }
        0
    }

    /// # Safety
    /// `info` describes a loaded object that stays loaded.
    unsafe fn patch_object(
        info: &libc::dl_phdr_info,
        replacement: fn(&[u8]) -> Option<usize>,
    ) -> usize {
        let base = info.dlpi_addr as usize;
        // SAFETY: the loader's program headers for this object.
        let headers = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum.into()) };
        let segment = |kind| {
            headers
                .iter()
                .find(|h| h.p_type == kind)
                .map(|h| (base + h.p_vaddr as usize, h.p_memsz as usize))
        };
        let Some((dynamic, _)) = segment(libc::PT_DYNAMIC) else {
            return 0;
        };
        let relro = segment(libc::PT_GNU_RELRO);
        let (mut strtab, mut symtab) = (0usize, 0usize);
        let mut tables = [(0usize, 0usize); 2]; // (address, bytes) of .rela.dyn, .rela.plt
        let mut entry = dynamic as *const Dyn;
        loop {
            // SAFETY: the dynamic section is an array ended by DT_NULL.
            let d = unsafe { &*entry };
            // glibc rebases these entries in place on most systems; where it
            // does not, they are offsets from the base.
            let address = |v: u64| {
                let v = v as usize;
                if v < base {
                    base + v
                } else {
                    v
                }
            };
            match d.tag {
                DT_NULL => break,
                DT_STRTAB => strtab = address(d.value),
                DT_SYMTAB => symtab = address(d.value),
                DT_RELA => tables[0].0 = address(d.value),
                DT_RELASZ => tables[0].1 = d.value as usize,
                DT_JMPREL => tables[1].0 = address(d.value),
                DT_PLTRELSZ => tables[1].1 = d.value as usize,
                _ => {}
            }
            // SAFETY: not past DT_NULL yet.
            entry = unsafe { entry.add(1) };
        }
        if strtab == 0 || symtab == 0 {
            return 0;
        }
        let mut patched = 0;
        for (table, bytes) in tables {
            if table == 0 {
                continue;
            }
            let count = bytes / std::mem::size_of::<Rela>();
            // SAFETY: the loader's relocation table of `count` entries.
            let relocations = unsafe { std::slice::from_raw_parts(table as *const Rela, count) };
            for r in relocations {
                if !SLOT_RELOCATIONS.contains(&((r.info & 0xffff_ffff) as u32)) {
                    continue;
                }
                // SAFETY: a slot relocation's symbol index is into the dynamic
                // symbol table, whose names are NUL-terminated in `strtab`.
                let name = unsafe {
                    let sym = &*(symtab as *const Sym).add((r.info >> 32) as usize);
                    CStr::from_ptr((strtab + sym.name as usize) as *const _)
                };
                let Some(function) = replacement(name.to_bytes()) else {
                    continue;
                };
                let slot = base + r.offset as usize;
                // SAFETY: `slot` is this object's GOT entry for `name`.
                if unsafe { write_slot(slot, function, relro) } {
                    patched += 1;
                }
            }
        }
        patched
    }

    /// Writes `value` into the pointer-sized GOT entry at `slot`, lifting
    /// the read-only protection of the RELRO segment around the write.
    ///
    /// # Safety
    /// `slot` is a GOT entry of a loaded object.
    unsafe fn write_slot(slot: usize, value: usize, relro: Option<(usize, usize)>) -> bool {
        let entry = slot as *mut usize;
        let read_only = relro.is_some_and(|(start, len)| slot >= start && slot < start + len);
        if !read_only {
            // SAFETY: a writable GOT entry; an aligned pointer store is atomic,
            // so a thread calling through it sees the old or the new function.
            unsafe { entry.write_volatile(value) };
            return true;
        }
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let start = (slot & !(page - 1)) as *mut c_void;
        // SAFETY: `start` is the page holding the entry, mapped read-only by
        // the loader; it is made writable only for the store.
        unsafe {
            if libc::mprotect(start, page, libc::PROT_READ | libc::PROT_WRITE) != 0 {
                return false;
            }
            entry.write_volatile(value);
            libc::mprotect(start, page, libc::PROT_READ);
        }
        true
    }
}

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
mod got {
    use super::*;

    pub(super) fn patch(
        _matches: &dyn Fn(&Path) -> bool,
        _replacement: fn(&[u8]) -> Option<usize>,
    ) -> usize {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn glibc_block(size: usize) -> *mut c_void {
        let mut ptr = std::ptr::null_mut();
        // SAFETY: a valid alignment; the test frees the block.
        assert_eq!(unsafe { libc::posix_memalign(&mut ptr, 64, size) }, 0);
        ptr
    }

    /// The C++ runtime, loaded as the plugin loads it: outside the global
    /// scope (this test binary does not load it otherwise).
    fn load_cxx_runtime() {
        // SAFETY: loads a system library by name.
        let cxx = unsafe {
            libc::dlopen(
                c"libstdc++.so.6".as_ptr(),
                libc::RTLD_NOW | libc::RTLD_LOCAL,
            )
        };
        assert!(!cxx.is_null());
    }

    /// The C++ runtime's own function `name`, taking a block and a size.
    fn runtime_sized(name: &CStr) -> unsafe extern "C" fn(*mut c_void, usize) {
        let f = runtime_function(name);
        assert!(!f.is_null(), "{name:?}");
        // SAFETY: the tests name functions with this signature.
        unsafe { std::mem::transmute(f) }
    }

    #[test]
    fn small_blocks_come_from_mimalloc_and_go_back_where_they_came_from() {
        load_cxx_runtime();
        for (size, align) in [
            (0, 64),
            (1, 8),
            (8, 16),
            (9, 16),
            (24, 16),
            (256, 64),
            (4000, 128),
            (MIN_CACHED_BYTES - 1, 4096),
        ] {
            let mut ptr = std::ptr::null_mut();
            assert_eq!(cached_posix_memalign(&mut ptr, align, size), 0);
            assert!(
                from_mimalloc(ptr) && ptr as usize % align == 0,
                "{size} bytes at {align}"
            );
            // SAFETY: the block holds at least `size` bytes.
            unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), 7, size) };
            let grown = cached_realloc(ptr, size + 100);
            // SAFETY: realloc kept the first `size` bytes.
            assert!(size == 0 || unsafe { *grown.cast::<u8>().add(size - 1) } == 7);
            cached_free(grown);
            let ptr = cached_aligned_alloc(align, size);
            assert!(from_mimalloc(ptr) && ptr as usize % align == 0);
            cached_free(ptr);
            let ptr = small_aligned_new(size, align);
            assert!(from_mimalloc(ptr) && ptr as usize % align == 0);
            checked_delete_aligned(ptr, align);
            let ptr = small_aligned_new_nothrow(size, align, std::ptr::null());
            assert!(from_mimalloc(ptr));
            checked_delete_sized_aligned(ptr, size, align);
            for new in [small_new, small_new_array] {
                let ptr = new(size);
                assert!(from_mimalloc(ptr) && ptr as usize % 16 == 0);
                checked_delete(ptr);
            }
            let ptr = small_new_nothrow(size, std::ptr::null());
            assert!(from_mimalloc(ptr));
            checked_delete_nothrow(ptr, std::ptr::null());
        }
        // A glibc block (one the plugin had before `install`) goes to glibc,
        // a C++ runtime one to its `delete`.
        let ptr = glibc_block(256);
        assert!(!from_mimalloc(ptr));
        cached_free(ptr);
        type AlignedNew = unsafe extern "C" fn(usize, usize) -> *mut c_void;
        // SAFETY: the symbol is that operator, with this signature.
        let aligned_new: AlignedNew =
            unsafe { std::mem::transmute(runtime_function(c"_ZnwmSt11align_val_t")) };
        // SAFETY: a valid size and alignment.
        let ptr = unsafe { aligned_new(256, 64) };
        assert!(!from_mimalloc(ptr));
        checked_delete_aligned(ptr, 64);
        // Blocks over MIN_CACHED_BYTES come from the runtime's `new`.
        let ptr = small_new(MIN_CACHED_BYTES);
        assert!(!ptr.is_null() && !from_mimalloc(ptr));
        checked_delete_sized(ptr, MIN_CACHED_BYTES);
        cached_free(std::ptr::null_mut());
        checked_delete(std::ptr::null_mut());
        assert!(!from_mimalloc(std::ptr::null()));
    }

    #[test]
    fn the_cxx_runtime_gives_mimalloc_blocks_back_to_mimalloc() {
        load_cxx_runtime();
        assert!(got::patch(&is_cxx_runtime, runtime_replacement) > 0);
        // libstdc++'s sized `delete` calls its plain one through its own GOT
        // entry, as its out-of-line string code does: glibc's `free` would
        // abort on a mimalloc block.
        let sized_delete = runtime_sized(c"_ZdlPvm");
        for size in [1, 100, 5000] {
            let ptr = small_new(size);
            assert!(from_mimalloc(ptr));
            // SAFETY: a live block of `size` bytes, given up.
            unsafe { sized_delete(ptr, size) };
        }
        // Its own blocks still go back to glibc through the same entry.
        type New = unsafe extern "C" fn(usize) -> *mut c_void;
        // SAFETY: the symbol is that operator, with this signature.
        let runtime_new: New = unsafe { std::mem::transmute(runtime_function(c"_Znwm")) };
        // SAFETY: a valid size; the block is given back below.
        let ptr = unsafe { runtime_new(64) };
        assert!(!from_mimalloc(ptr));
        // SAFETY: the runtime's block of 64 bytes, given back.
        unsafe { sized_delete(ptr, 64) };
    }

    #[test]
    fn a_tracked_block_is_found_once() {
        let ptr = glibc_block(MIN_CACHED_BYTES);
        track(Block {
            ptr,
            size: MIN_CACHED_BYTES,
            align: 64,
        });
        let block = untrack(ptr).expect("tracked");
        assert_eq!((block.size, block.align), (MIN_CACHED_BYTES, 64));
        assert!(untrack(ptr).is_none());
        // SAFETY: allocated above, no longer tracked.
        unsafe { libc::free(ptr) };
    }

    #[test]
    fn hundreds_of_live_blocks_are_all_tracked() {
        let blocks: Vec<Block> = (0..300)
            .map(|_| Block {
                ptr: glibc_block(4096),
                size: 4096,
                align: 64,
            })
            .collect();
        for &block in &blocks {
            track(block);
        }
        for block in blocks {
            assert!(untrack(block.ptr).is_some());
            // SAFETY: allocated above, no longer tracked.
            unsafe { libc::free(block.ptr) };
        }
    }

    #[test]
    fn null_is_never_tracked() {
        let ptr = glibc_block(MIN_CACHED_BYTES);
        track(Block {
            ptr,
            size: MIN_CACHED_BYTES,
            align: 64,
        });
        // free(NULL) is no block's, whatever shares its bucket.
        assert!(untrack(std::ptr::null_mut()).is_none());
        assert!(untrack(ptr).is_some());
        // SAFETY: allocated above, no longer tracked.
        unsafe { libc::free(ptr) };
    }

    fn is_kept(ptr: *mut c_void) -> bool {
        lock(&KEPT).blocks.iter().any(|(b, _)| b.ptr == ptr)
    }

    /// Serialises the tests that keep blocks: one's window or `release`
    /// would give back another's.
    static KEEPING: Mutex<()> = Mutex::new(());

    #[test]
    fn a_kept_block_serves_a_request_it_fits_closely() {
        let _keeping = lock(&KEEPING);
        let size = 2 * MIN_CACHED_BYTES;
        let ptr = take(size, 128);
        cached_free(ptr);
        assert!(is_kept(ptr));
        // Half of it would be wasted: a new block.
        let other = take(size / 2, 128);
        assert_ne!(other, ptr);
        // Another alignment: a new block.
        let other_align = take(size - 4096, 256);
        assert_ne!(other_align, ptr);
        // An eighth of it left over: the kept block, still tracked at its
        // whole size.
        let reused = take(size - size / 8, 128);
        assert_eq!(reused, ptr);
        assert!(!is_kept(ptr));
        assert_eq!(untrack(ptr).map(|b| b.size), Some(size));
        track(Block {
            ptr,
            size,
            align: 128,
        });
        for block in [reused, other, other_align] {
            cached_free(block);
        }
        release();
    }

    #[test]
    fn a_request_just_past_a_kept_block_gives_it_back() {
        let _keeping = lock(&KEEPING);
        let size = 2 * MIN_CACHED_BYTES;
        let first = take(size, 128);
        cached_free(first);
        // Twice its size, or another alignment: the kept block may still
        // serve a request of its own, and stays.
        let double = take(2 * size, 128);
        let other_align = take(size + size / 8, 256);
        assert!(is_kept(first));
        // An eighth larger, as the next step's temporary is: its successor.
        let larger = take(size + size / 8, 128);
        assert!(!is_kept(first));
        assert_eq!(lock(&KEPT).bytes, 0);
        for block in [double, other_align, larger] {
            cached_free(block);
        }
        release();
    }

    #[test]
    fn large_plain_mallocs_are_cached_and_small_ones_left_to_glibc() {
        let _keeping = lock(&KEEPING);
        let small = cached_malloc(1000);
        assert!(!small.is_null() && !from_mimalloc(small));
        assert!(untrack(small).is_none());
        cached_free(small);
        let large = cached_malloc(MIN_CACHED_BYTES + 100);
        assert_eq!(large as usize % MALLOC_ALIGN, 0);
        // SAFETY: the block holds that many bytes.
        unsafe { std::ptr::write_bytes(large.cast::<u8>(), 1, MIN_CACHED_BYTES + 100) };
        cached_free(large);
        assert!(is_kept(large));
        assert_eq!(cached_malloc(MIN_CACHED_BYTES + 100), large);
        cached_free(large);
        release();
    }

    #[test]
    fn a_kept_block_no_request_claims_goes_back_after_the_window() {
        let _keeping = lock(&KEEPING);
        let block = |size| Block {
            ptr: glibc_block(size),
            size,
            align: 64,
        };
        let first = block(4096);
        keep(first);
        for _ in 0..KEPT_WINDOW {
            keep(block(8192));
        }
        assert!(is_kept(first.ptr));
        keep(block(8192));
        assert!(!is_kept(first.ptr));
        release();
    }

    #[test]
    fn a_stale_entry_smaller_than_recorded_is_not_kept() {
        // As if a tracked block had been freed behind the plugin's back and
        // glibc had put a smaller allocation at its address.
        let ptr = glibc_block(4096);
        track(Block {
            ptr,
            size: 2 * MIN_CACHED_BYTES,
            align: 64,
        });
        assert!(untrack(ptr).is_none());
        // SAFETY: allocated above; the caller of `untrack` frees it.
        unsafe { libc::free(ptr) };
    }
}
