//! The engine: runs what op lowerings build, eagerly (`eager`; a repeated
//! eager call by its first call's plan, `plan`), recorded into one pending
//! graph per device (`deferred`), or captured for replay (`capture`);
//! caches executables and explains recompiles (`cache`).

pub mod cache;
pub mod capture;
mod checks;
pub mod deferred;
pub mod disk_cache;
mod eager;
mod failure;
mod launch;
pub mod location;
pub mod mode;
mod plan;
mod spmd;
pub mod work;

use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use crate::builder::Builder;
pub use crate::builder::{Arg, Output, TensorArg};
use crate::error::{Error, Result};
use crate::metrics::{self, Metric};
use crate::ops;
use crate::runtime::Client;
use crate::storage::{self, ElementRead, PendingWork};

pub(crate) use eager::host_input;

/// The engine's side of storages' pending values (`storage::PendingWork`).
struct EngineWork;

impl PendingWork for EngineWork {
    fn flush_device(&self, client: &Client, device_index: usize) -> Result<()> {
        deferred::flush_device(client, device_index)
    }

    fn note_host_read(&self) {
        capture::note_host_read()
    }

    fn verify_checks(&self) -> Result<()> {
        checks::verify_checks()
    }

    fn read_elements(&self, read: ElementRead<'_>) -> Result<Vec<u8>> {
        eager::read_elements(read)
    }
}

/// The engine state `cell` holds for the whole process, made on first use.
/// A panic while it was held does not poison it for later calls.
fn global<T: Default>(cell: &'static OnceLock<Mutex<T>>) -> MutexGuard<'static, T> {
    cell.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Called by the entries that can make pending values, captures or device
/// checks (op calls, captures) before they do.
pub(super) fn install_pending_work() {
    storage::set_pending_work(&EngineWork);
}

/// Schema names of the ops the engine runs; an op's id is its index here.
pub fn op_names() -> Vec<&'static str> {
    ops::table().iter().map(|op| op.name).collect()
}

/// The id of the op with this schema name.
pub fn find_op(name: &str) -> Option<usize> {
    ops::table().iter().position(|op| op.name == name)
}

/// Runs op `op` (an index into `op_names()`) on `args`.
pub fn call(client: &Client, op: usize, args: &[Arg]) -> Result<Vec<Output>> {
    let def = ops::table()
        .get(op)
        .ok_or_else(|| Error::invalid("op id", format!("less than {}", ops::table().len()), op))?;
    install_pending_work();
    let start = Instant::now();
    let current = mode::current();
    let site = plan::Site::new(client, op, args, current);
    if let Some(outputs) = plan::replay(&site, client, args)? {
        metrics::add(Metric::OpsRun, 1);
        return Ok(outputs);
    }
    let builder = match plan::rebuild(&site, client, def.name, args) {
        Some(builder) => builder,
        None => {
            let mut builder = Builder::new(client, def.name, args, current)?;
            (def.lower)(&mut builder)?;
            if current == mode::Mode::Deferred {
                plan::remember_recorded(&site, &builder);
            }
            builder
        }
    };
    let outputs = eager::run(builder, &site)?;
    if current != mode::Mode::Eager {
        metrics::add_elapsed(Metric::RecordNs, start);
    } else {
        metrics::add(Metric::OpsRun, 1);
    }
    Ok(outputs)
}
