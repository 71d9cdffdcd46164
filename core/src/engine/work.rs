//! The work each device has in flight, and markers of points in it: what a
//! torch Event records, queries, waits for and times, and what
//! `synchronize` waits for.
//!
//! Every program the engine launches (eager ops, deferred graphs, captured
//! graphs) is registered here with the event PJRT's execute returns for its
//! completion on the device (cheaper than asking an output for one). A
//! marker holds the launches not yet finished when it was made; ops still
//! pending in deferred mode are not launched yet, so no marker covers them.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use rustc_hash::FxHashMap;

use crate::error::Result;
use crate::runtime::{Buffer, Client, Event};

/// One launched program.
struct Launch {
    ready: Event,
    /// When it finished: set by the event's callback once a marker asked
    /// for it (`time`), or by whoever first sees the event ready.
    finished_at: Arc<OnceLock<Instant>>,
    /// Whether `time` registered the callback already.
    timed: AtomicBool,
    /// Input buffers the program took over (donated). Destroying such a
    /// handle waits until the program has run (the CPU plugin blocks), so
    /// they are dropped with the launch, once it finished.
    _donated: Vec<Arc<Buffer>>,
}

impl Launch {
    /// When the program finished, or None while it runs.
    fn finished(&self) -> Result<Option<Instant>> {
        if let Some(at) = self.finished_at.get() {
            return Ok(Some(*at));
        }
        Ok(self
            .ready
            .is_ready()?
            .then(|| *self.finished_at.get_or_init(Instant::now)))
    }

    /// Has the event's callback note when the program finishes, which a
    /// marker's timing needs to the microsecond. Not done per launch: the
    /// callback cost an eager op a few percent of its host time.
    fn time(&self) -> Result<()> {
        if self.timed.swap(true, Ordering::Relaxed) {
            return Ok(());
        }
        // Not the launch itself: its last reference must not drop on the
        // plugin's thread, inside the callback.
        let set = self.finished_at.clone();
        self.ready.on_ready(Box::new(move || {
            set.get_or_init(Instant::now);
        }))
    }
}

/// Launches not known to be finished, per (client id, device index), in
/// launch order.
type InFlight = FxHashMap<(usize, usize), VecDeque<Arc<Launch>>>;

fn in_flight() -> MutexGuard<'static, InFlight> {
    static IN_FLIGHT: OnceLock<Mutex<InFlight>> = OnceLock::new();
    super::global(&IN_FLIGHT)
}

/// Lets go of the launches at the front of `launches` that have finished.
/// A device runs its programs in about the order they were launched, so
/// this keeps the list short while asking about one or two events per
/// launch, not every one in flight. A launch whose event cannot be asked
/// stays: waiting for it reports why. Its finishing time is not taken
/// here: a marker holding the launch has its callback or asks it again.
fn let_go_of_finished(launches: &mut VecDeque<Arc<Launch>>) {
    while launches
        .front()
        .is_some_and(|first| matches!(first.ready.is_ready(), Ok(true)))
    {
        launches.pop_front();
    }
}

/// Registers a program just launched on `device_index` of `client`, which
/// is finished when `ready` is and took over the `donated` input buffers.
pub(super) fn launched(
    client: &Client,
    device_index: usize,
    ready: Event,
    donated: Vec<Arc<Buffer>>,
) {
    let mut all = in_flight();
    let launches = all.entry((client.id(), device_index)).or_default();
    let_go_of_finished(launches);
    // Kept even when it finished already: a wait made before the next
    // launch reports its error.
    launches.push_back(Arc::new(Launch {
        ready,
        finished_at: Arc::new(OnceLock::new()),
        timed: AtomicBool::new(false),
        _donated: donated,
    }));
}

/// A point in a device's work: everything launched on it before the marker
/// was made.
pub struct Marker {
    launches: Vec<Arc<Launch>>,
    made_at: Instant,
}

impl Marker {
    /// Marks the work launched so far on `device_index` of `client`.
    pub fn new(client: &Client, device_index: usize) -> Result<Marker> {
        client.device(device_index)?;
        let made_at = Instant::now();
        let mut all = in_flight();
        let launches = all.entry((client.id(), device_index)).or_default();
        let_go_of_finished(launches);
        for launch in launches.iter() {
            launch.time()?;
        }
        Ok(Marker {
            launches: launches.iter().cloned().collect(),
            made_at,
        })
    }

    /// When the marked work had all finished (no earlier than when the
    /// marker was made), or None while some of it runs.
    pub fn finished_at(&self) -> Result<Option<Instant>> {
        let mut last = self.made_at;
        for launch in &self.launches {
            match launch.finished()? {
                Some(at) => last = last.max(at),
                None => return Ok(None),
            }
        }
        Ok(Some(last))
    }

    /// Blocks until the marked work has finished; returns the first error of
    /// the programs it waited for.
    pub fn wait(&self) -> Result<()> {
        let mut first_error = None;
        for launch in &self.launches {
            let result = launch.ready.wait();
            // Finished either way: a failed program is not waited for again.
            launch.finished_at.get_or_init(Instant::now);
            if let Err(e) = result {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Milliseconds from `self`'s point in the work to `later`'s; None
    /// unless both have finished.
    pub fn elapsed_ms(&self, later: &Marker) -> Result<Option<f64>> {
        let (Some(start), Some(end)) = (self.finished_at()?, later.finished_at()?) else {
            return Ok(None);
        };
        let ms = |from: Instant, to: Instant| to.duration_since(from).as_secs_f64() * 1e3;
        // Negative when `later` was made first, as CUDA's events give it.
        Ok(Some(if end >= start {
            ms(start, end)
        } else {
            -ms(end, start)
        }))
    }
}

/// Blocks until every launched program on every device has finished;
/// returns the first error of the programs it waited for. The finished
/// launches are let go, so nothing they donated outlives the wait.
pub(super) fn wait_all() -> Result<()> {
    let launches: Vec<Arc<Launch>> = in_flight().values().flatten().cloned().collect();
    let waited = Marker {
        launches,
        made_at: Instant::now(),
    }
    .wait();
    for launches in in_flight().values_mut() {
        launches.retain(|l| l.finished_at.get().is_none());
    }
    waited
}
