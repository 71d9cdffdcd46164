//! Compile options, serialised as XLA's `CompileOptionsProto`.

use prost::Message;

use pjrt_sys::protos::xla::{
    device_assignment_proto::ComputationDevice, CompileOptionsProto, DeviceAssignmentProto,
    ExecutableBuildOptionsProto,
};

use crate::error::{Error, Result};

/// How to compile a program: its replica and partition counts, SPMD
/// partitioning, and optionally which device runs each (replica, partition).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CompileOptions {
    pub num_replicas: usize,
    pub num_partitions: usize,
    /// Run XLA's SPMD partitioner over `mhlo.sharding` annotations.
    pub use_spmd_partitioning: bool,
    /// `device_assignment[replica][partition]` is a device id; `None` lets the
    /// plugin choose its default assignment.
    pub device_assignment: Option<Vec<Vec<i64>>>,
    /// Per output of an SPMD program: may XLA choose its sharding (read
    /// back with `LoadedExecutable::output_shardings`)? Empty: no output.
    pub propagate_output_shardings: Vec<bool>,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            num_replicas: 1,
            num_partitions: 1,
            use_spmd_partitioning: false,
            device_assignment: None,
            propagate_output_shardings: Vec::new(),
        }
    }
}

impl CompileOptions {
    /// The serialised `CompileOptionsProto` PJRT expects. PJRT aborts on empty
    /// options, so replica and partition counts are always written.
    pub fn to_proto_bytes(&self) -> Result<Vec<u8>> {
        if self.num_replicas == 0 || self.num_partitions == 0 {
            return Err(Error::invalid(
                "compile options",
                "num_replicas >= 1 and num_partitions >= 1",
                format!(
                    "num_replicas={} num_partitions={}",
                    self.num_replicas, self.num_partitions
                ),
            ));
        }
        let device_assignment = match &self.device_assignment {
            None => None,
            Some(rows) => Some(self.assignment_proto(rows)?),
        };
        let build = ExecutableBuildOptionsProto {
            // -1: let the plugin pick the device (the field's XLA default).
            device_ordinal: -1,
            num_replicas: self.num_replicas as i64,
            num_partitions: self.num_partitions as i64,
            use_spmd_partitioning: self.use_spmd_partitioning,
            device_assignment,
            allow_spmd_sharding_propagation_to_output: self.propagate_output_shardings.clone(),
            ..Default::default()
        };
        let options = CompileOptionsProto {
            executable_build_options: Some(build),
            ..Default::default()
        };
        Ok(options.encode_to_vec())
    }

    fn assignment_proto(&self, rows: &[Vec<i64>]) -> Result<DeviceAssignmentProto> {
        let shape_ok =
            rows.len() == self.num_replicas && rows.iter().all(|r| r.len() == self.num_partitions);
        if !shape_ok {
            return Err(Error::invalid(
                "device assignment",
                format!(
                    "{} replicas x {} partitions",
                    self.num_replicas, self.num_partitions
                ),
                format!(
                    "rows of lengths {:?}",
                    rows.iter().map(Vec::len).collect::<Vec<_>>()
                ),
            ));
        }
        // The proto is stored partition-major: one entry per computation
        // (partition), listing its device for every replica.
        let computation_devices = (0..self.num_partitions)
            .map(|p| ComputationDevice {
                replica_device_ids: rows.iter().map(|r| r[p]).collect(),
            })
            .collect();
        Ok(DeviceAssignmentProto {
            replica_count: self.num_replicas as i32,
            computation_count: self.num_partitions as i32,
            computation_devices,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_replicas_is_rejected() {
        let options = CompileOptions {
            num_replicas: 0,
            ..Default::default()
        };
        assert!(options.to_proto_bytes().is_err());
    }

    #[test]
    fn assignment_must_match_counts() {
        let options = CompileOptions {
            num_replicas: 2,
            device_assignment: Some(vec![vec![0]]),
            ..Default::default()
        };
        assert!(options.to_proto_bytes().is_err());
    }

    #[test]
    fn assignment_is_partition_major() {
        let options = CompileOptions {
            num_replicas: 2,
            num_partitions: 2,
            device_assignment: Some(vec![vec![0, 1], vec![2, 3]]),
            ..Default::default()
        };
        let bytes = options.to_proto_bytes().unwrap();
        let proto = CompileOptionsProto::decode(bytes.as_slice()).unwrap();
        let assignment = proto
            .executable_build_options
            .unwrap()
            .device_assignment
            .unwrap();
        assert_eq!(
            assignment.computation_devices[0].replica_device_ids,
            vec![0, 2]
        );
        assert_eq!(
            assignment.computation_devices[1].replica_device_ids,
            vec![1, 3]
        );
    }
}
