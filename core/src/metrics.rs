//! rtpu's counters, declared once: each metric's name, unit and one-line
//! help live in the table below, and the C ABI, the PyTorch shim and
//! `rtpu.metrics()` read them by name from here.
//!
//! This module depends on nothing else in the crate, so every layer (the
//! runtime counting buffers, storages counting transfers, the engine
//! counting ops) can count without reaching into another.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// What a metric's value measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Events since the process started.
    Count,
    /// Bytes since the process started.
    Bytes,
    /// Nanoseconds since the process started.
    Nanoseconds,
    /// How many exist now (goes up and down).
    Live,
}

impl Unit {
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Count => "count",
            Unit::Bytes => "bytes",
            Unit::Nanoseconds => "ns",
            Unit::Live => "live",
        }
    }
}

/// One metric's description.
#[derive(Clone, Copy, Debug)]
pub struct MetricDef {
    /// A stable snake_case name (`ops_run`).
    pub name: &'static str,
    pub unit: Unit,
    /// One line saying what is counted.
    pub help: &'static str,
}

macro_rules! metrics {
    ($($variant:ident = $name:literal, $unit:ident, $help:literal;)*) => {
        /// Every metric; its index in `definitions()` is its discriminant.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Metric {
            $($variant,)*
        }

        const DEFINITIONS: &[MetricDef] = &[
            $(MetricDef { name: $name, unit: Unit::$unit, help: $help },)*
        ];
    };
}

// New metrics are appended: C callers may read them by index.
metrics! {
    OpsRun = "ops_run", Count, "ops run one at a time (eager mode)";
    OpsRecorded = "ops_recorded", Count, "ops recorded into pending graphs (deferred mode)";
    ExecutablesCompiled = "executables_compiled", Count, "programs compiled by XLA";
    CacheHits = "cache_hits", Count, "programs found in the in-memory cache";
    DiskCacheHits = "disk_cache_hits", Count, "programs loaded from the disk cache instead of compiled";
    GraphExecutions = "graph_executions", Count, "deferred or captured graphs run";
    Recompiles = "recompiles", Count, "compiles at a flush site that had compiled another graph before";
    RecordNs = "record_ns", Nanoseconds, "time recording ops into pending graphs";
    CompileNs = "compile_ns", Nanoseconds, "time compiling programs";
    ExecuteNs = "execute_ns", Nanoseconds, "time launching programs (their device time overlaps the host's)";
    WaitNs = "wait_ns", Nanoseconds, "time the host waited for device results";
    HostToDeviceBytes = "host_to_device_bytes", Bytes, "bytes copied from the host to devices";
    DeviceToHostBytes = "device_to_host_bytes", Bytes, "bytes copied from devices to the host";
    LiveBuffers = "live_buffers", Live, "device buffers alive now";
    BuffersDonated = "buffers_donated", Count, "input buffers donated to graphs (their memory reused for outputs)";
    CollectivesRun = "collectives_run", Count, "collectives run over the devices of a communicator";
    CollectiveBytes = "collective_bytes", Bytes, "bytes the ranks' tensors of those collectives held";
    ExecutablesEvicted = "executables_evicted", Count, "programs dropped from the in-memory cache past RTPU_MEMORY_CACHE_ENTRIES";
    CollectiveSplits = "collective_splits", Count, "step programs ended early at a collective the plugin cannot run inside a program (staged through the host)";
    SpmdExecutions = "spmd_executions", Count, "programs run partitioned over the devices of a mesh (SPMD)";
    SpmdCollectives = "spmd_collectives", Count, "collectives XLA's partitioner put in the SPMD programs compiled or loaded";
    SpmdReplicatedBytes = "spmd_replicated_bytes", Bytes, "bytes of unsharded inputs of SPMD programs copied to the other devices of the mesh";
    SpmdCollectiveBytes = "spmd_collective_bytes", Bytes, "bytes the collectives of the SPMD programs run produced on each device (their results' sizes, per device)";
    HostCacheBytes = "host_cache_bytes", Live, "bytes of large blocks the CPU plugin freed, kept for its next requests (given back by empty_cache)";
    HostCacheReuses = "host_cache_reuses", Count, "large blocks the CPU plugin got from those kept instead of from the system";
    OpsReplayed = "ops_replayed", Count, "ops run eagerly by the plan of an earlier call with the same shapes and scalars, without lowering them again";
    OpsRecordedByPlan = "ops_recorded_by_plan", Count, "ops recorded (deferred mode) from the graph an earlier call built with the same shapes and scalars, its storages holding the same kinds of values, without lowering them again";
}

const COUNT: usize = DEFINITIONS.len();

static VALUES: [AtomicU64; COUNT] = [const { AtomicU64::new(0) }; COUNT];

/// Every metric's description, in `Metric` order.
pub fn definitions() -> &'static [MetricDef] {
    DEFINITIONS
}

/// The metric with this name.
pub fn find(name: &str) -> Option<usize> {
    DEFINITIONS.iter().position(|d| d.name == name)
}

/// Adds `n` to `metric`.
pub fn add(metric: Metric, n: u64) {
    VALUES[metric as usize].fetch_add(n, Ordering::Relaxed);
}

/// Subtracts `n` from a `Live` metric.
pub fn sub(metric: Metric, n: u64) {
    VALUES[metric as usize].fetch_sub(n, Ordering::Relaxed);
}

/// Adds the time since `start` to a `Nanoseconds` metric.
pub fn add_elapsed(metric: Metric, start: Instant) {
    add(metric, start.elapsed().as_nanos() as u64);
}

/// The current value of `metric`.
pub fn value(metric: Metric) -> u64 {
    VALUES[metric as usize].load(Ordering::Relaxed)
}

/// The value of the metric at `index` in `definitions()`.
pub fn value_at(index: usize) -> Option<u64> {
    VALUES.get(index).map(|v| v.load(Ordering::Relaxed))
}

/// Every metric's current value, in `definitions()` order.
pub fn values() -> Vec<u64> {
    VALUES.iter().map(|v| v.load(Ordering::Relaxed)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_snake_case_and_found() {
        for (index, def) in definitions().iter().enumerate() {
            assert!(
                def.name.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{}",
                def.name
            );
            assert_eq!(find(def.name), Some(index), "{} is listed twice", def.name);
            assert!(!def.help.is_empty());
        }
        assert_eq!(find("no_such_metric"), None);
    }

    #[test]
    fn a_metric_reads_back_what_was_added_by_name_and_by_index() {
        // No other unit test runs programs, so nothing else donates.
        let index = find("buffers_donated").unwrap();
        let before = value(Metric::BuffersDonated);
        add(Metric::BuffersDonated, 3);
        assert_eq!(value(Metric::BuffersDonated), before + 3);
        assert_eq!(value_at(index), Some(before + 3));
        assert_eq!(values()[index], before + 3);
        assert_eq!(value_at(COUNT), None);
    }
}
