//! Compiling StableHLO, executing on one or several devices, and
//! (de)serialising executables.

use std::borrow::Borrow;
use std::cell::Cell;
use std::ffi::c_char;
use std::fmt;
use std::sync::Arc;

use pjrt_sys::protos::xla::{op_sharding, HloModuleProto, OpSharding, PrimitiveType, ShapeProto};
use prost::Message;

use crate::runtime::sys::{
    self, Args, PJRT_Buffer, PJRT_Event, PJRT_Executable, PJRT_LoadedExecutable,
};

use super::buffer::Buffer;
use super::client::{owned_string, Client, ClientInner, Device};
use super::compile::CompileOptions;
use super::event::Event;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::sharding::Sharding;

/// A compiled program loaded on its devices. Holds its client alive.
pub struct LoadedExecutable {
    client: Arc<ClientInner>,
    raw: *mut PJRT_LoadedExecutable,
    devices: Vec<Device>,
    num_outputs: usize,
    /// Per-device parameter types from the optimised program; `None` when the
    /// plugin cannot return it (execution then relies on the plugin's checks,
    /// which on the CPU plugin only compare byte sizes).
    parameters: Option<Vec<ParameterType>>,
    /// Per-device output types, likewise: new output buffers start with
    /// their shape known instead of asking the plugin for it.
    outputs: Option<Vec<ParameterType>>,
    /// How an SPMD program lays out each output over its partitions, as
    /// XLA chose or was told; `None` for other programs or when the plugin
    /// does not say.
    output_shardings: Option<Vec<Sharding>>,
    /// The collectives of the optimised program (what an SPMD partitioner
    /// inserted), when the plugin returns it.
    collectives: Option<Collectives>,
}

/// The collective operations of one device's program.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Collectives {
    pub count: usize,
    /// The bytes of their results: what one run moves into this device.
    pub result_bytes: u64,
}

/// The type of one program parameter (or output) as each device receives
/// (or makes) it: a shard, for SPMD-partitioned programs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParameterType {
    pub dtype: DType,
    pub dims: Vec<i64>,
}

// SAFETY: PJRT executables are thread-safe; concurrent executions are allowed.
unsafe impl Send for LoadedExecutable {}
// SAFETY: as above.
unsafe impl Sync for LoadedExecutable {}

impl Drop for LoadedExecutable {
    fn drop(&mut self) {
        let mut args = sys::PJRT_LoadedExecutable_Destroy_Args::new();
        args.executable = self.raw;
        // SAFETY: `raw` is owned by `self` and destroyed exactly once.
        let _ = unsafe { pjrt_call!(self.client.plugin, PJRT_LoadedExecutable_Destroy, &mut args) };
    }
}

/// The arrays one execution hands PJRT, kept per thread between
/// executions. Taken out while in use, so an execution that starts inside
/// another (none does today) makes its own.
#[derive(Default)]
struct ExecuteArrays {
    non_donatable: Vec<i64>,
    arg_rows: Vec<*mut PJRT_Buffer>,
    arg_ptrs: Vec<*const *mut PJRT_Buffer>,
    out_rows: Vec<*mut PJRT_Buffer>,
    out_ptrs: Vec<*mut *mut PJRT_Buffer>,
    events: Vec<*mut PJRT_Event>,
}

thread_local! {
    static EXECUTE_ARRAYS: Cell<ExecuteArrays> = Cell::default();
}

/// An enqueued execution.
pub(crate) struct Execution {
    /// The outputs, per device.
    pub outputs: Vec<Vec<Buffer>>,
    /// Per device, an event that is ready once that device has finished the
    /// execution (None if the plugin gave none).
    pub finished: Vec<Option<Event>>,
}

/// Options of one execution.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecuteOptions {
    /// Argument indices whose buffers the program may donate to its outputs
    /// (where the program declares an alias). All other arguments are kept.
    /// A donated buffer is deleted by the execution.
    pub donate: Vec<usize>,
    /// Return once the execution is enqueued instead of when it finishes.
    /// Outputs are usable at once (PJRT orders later work after it); an
    /// execution error then surfaces when an output is read.
    pub asynchronous: bool,
}

/// The non-owning `PJRT_Executable` view of a loaded executable, destroyed on drop.
struct ExecutableView<'a> {
    owner: &'a LoadedExecutable,
    raw: *mut PJRT_Executable,
}

impl Drop for ExecutableView<'_> {
    fn drop(&mut self) {
        let mut args = sys::PJRT_Executable_Destroy_Args::new();
        args.executable = self.raw;
        // SAFETY: `GetExecutable` hands out a handle the caller must destroy.
        let _ = unsafe { pjrt_call!(self.owner.client.plugin, PJRT_Executable_Destroy, &mut args) };
    }
}

/// What the optimised program says of its entry.
#[derive(Default)]
struct Signature {
    parameters: Option<Vec<ParameterType>>,
    outputs: Option<Vec<ParameterType>>,
    output_shardings: Option<Vec<Sharding>>,
    collectives: Option<Collectives>,
}

/// HLO opcodes that move data between partitions or replicas.
const COLLECTIVE_OPCODES: &[&str] = &[
    "all-reduce",
    "all-reduce-start",
    "all-gather",
    "all-gather-start",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
    "collective-permute-start",
    "collective-broadcast",
];

impl ExecutableView<'_> {
    /// Reads the entry signature from the optimised HLO module. Any failure
    /// (an older plugin, a format other than HLO) leaves it unknown.
    fn signature(&self, partitions: usize) -> Signature {
        let Some(module) = self.optimized_module() else {
            return Signature::default();
        };
        let output_ranks: Option<Vec<usize>> = module
            .host_program_shape
            .as_ref()
            .and_then(|shape| shape.result.as_ref())
            .map(|result| match result.tuple_shapes.is_empty() {
                true => vec![result.dimensions.len()],
                false => result
                    .tuple_shapes
                    .iter()
                    .map(|t| t.dimensions.len())
                    .collect(),
            });
        let output_shardings = module
            .spmd_output_sharding
            .as_ref()
            .zip(output_ranks)
            .and_then(|(sharding, ranks)| {
                let each: Vec<&OpSharding> = match sharding.r#type() {
                    op_sharding::Type::Tuple => sharding.tuple_shardings.iter().collect(),
                    _ => vec![sharding; ranks.len()],
                };
                (each.len() == ranks.len()).then_some(())?;
                each.iter()
                    .zip(ranks)
                    .map(|(s, rank)| sharding_from_proto(s, rank, partitions))
                    .collect()
            });
        let collectives = module
            .computations
            .iter()
            .flat_map(|c| &c.instructions)
            .filter(|i| COLLECTIVE_OPCODES.contains(&i.opcode.as_str()))
            .fold(Collectives::default(), |sum, i| Collectives {
                count: sum.count + 1,
                result_bytes: sum.result_bytes + i.shape.as_ref().map_or(0, shape_bytes),
            });
        let outputs = module
            .host_program_shape
            .as_ref()
            .and_then(|shape| shape.result.as_ref())
            .and_then(|result| match result.tuple_shapes.is_empty() {
                true => parameter_type(result).map(|t| vec![t]),
                false => result.tuple_shapes.iter().map(parameter_type).collect(),
            });
        let parameters = module
            .host_program_shape
            .and_then(|shape| shape.parameters.iter().map(parameter_type).collect());
        Signature {
            parameters,
            outputs,
            output_shardings,
            collectives: Some(collectives),
        }
    }

    fn optimized_module(&self) -> Option<HloModuleProto> {
        let plugin = self.owner.client.plugin;
        let format = "hlo";
        let mut program = sys::PJRT_Program::new();
        program.format = format.as_ptr().cast();
        program.format_size = format.len();
        let mut args = sys::PJRT_Executable_OptimizedProgram_Args::new();
        args.executable = self.raw;
        args.program = &mut program;
        // SAFETY: with `code` NULL, PJRT only writes the size it needs.
        unsafe { pjrt_call!(plugin, PJRT_Executable_OptimizedProgram, &mut args) }.ok()?;
        let mut code = vec![0u8; program.code_size];
        program.code = code.as_mut_ptr().cast();
        args.program = &mut program;
        // SAFETY: `code` holds `code_size` writable bytes for the call.
        unsafe { pjrt_call!(plugin, PJRT_Executable_OptimizedProgram, &mut args) }.ok()?;
        let code = &code[..program.code_size.min(code.len())];
        // SAFETY: PJRT set `format` to a string it owns for the executable's lifetime.
        match unsafe { owned_string(program.format, program.format_size) }.as_str() {
            "hlo" => HloModuleProto::decode(code).ok(),
            "hlo_with_config" => HloModuleWithConfig::decode(code).ok()?.hlo_module,
            _ => None,
        }
    }
}

/// XLA's sharding of a rank-`rank` output over `partitions`, as a
/// `Sharding`; None for one the engine cannot hold (manual, or partial
/// tiles of other kinds).
fn sharding_from_proto(proto: &OpSharding, rank: usize, partitions: usize) -> Option<Sharding> {
    let tile_devices = || -> Option<Vec<usize>> {
        if proto.iota_reshape_dims.is_empty() {
            return proto
                .tile_assignment_devices
                .iter()
                .map(|&d| usize::try_from(d).ok())
                .collect();
        }
        Some(iota_devices(
            &proto.iota_reshape_dims,
            &proto.iota_transpose_perm,
        ))
    };
    match proto.r#type() {
        op_sharding::Type::Replicated => Some(Sharding::replicated(rank, partitions)),
        op_sharding::Type::Maximal => Some(Sharding {
            tiles: vec![1; rank],
            replicas: 1,
            partitions: vec![usize::try_from(*proto.tile_assignment_devices.first()?).ok()?],
        }),
        op_sharding::Type::Other => {
            let dims = &proto.tile_assignment_dimensions;
            let copy_dims = if proto.replicate_on_last_tile_dim {
                1
            } else {
                let kinds = &proto.last_tile_dims;
                kinds
                    .iter()
                    .all(|&k| k == op_sharding::Type::Replicated as i32)
                    .then_some(kinds.len())?
            };
            (dims.len() == rank + copy_dims).then_some(())?;
            Some(Sharding {
                tiles: dims[..rank].to_vec(),
                replicas: dims[rank..].iter().product(),
                partitions: tile_devices()?,
            })
        }
        _ => None,
    }
}

/// The devices of XLA's iota tile assignment: `0..n` reshaped to
/// `reshape`, transposed by `perm`, read row-major.
fn iota_devices(reshape: &[i64], perm: &[i32]) -> Vec<usize> {
    let n: i64 = reshape.iter().product();
    let perm: Vec<usize> = match perm.len() == reshape.len() {
        true => perm.iter().map(|&p| p as usize).collect(),
        false => (0..reshape.len()).collect(),
    };
    let transposed: Vec<i64> = perm.iter().map(|&p| reshape[p]).collect();
    (0..n)
        .map(|flat| {
            let mut rest = flat;
            let mut original = vec![0i64; reshape.len()];
            for d in (0..transposed.len()).rev() {
                original[perm[d]] = rest % transposed[d];
                rest /= transposed[d];
            }
            original
                .iter()
                .zip(reshape)
                .fold(0i64, |acc, (&i, &size)| acc * size + i) as usize
        })
        .collect()
}

/// XLA's `HloModuleProtoWithConfig` (newer than pjrt-sys's protos), of which
/// only the module is read.
#[derive(Clone, PartialEq, prost::Message)]
struct HloModuleWithConfig {
    #[prost(message, optional, tag = "1")]
    hlo_module: Option<HloModuleProto>,
}

fn parameter_type(shape: &ShapeProto) -> Option<ParameterType> {
    Some(ParameterType {
        dtype: element_dtype(shape.element_type)?,
        dims: shape.dimensions.clone(),
    })
}

/// The bytes of a value of `shape` (a tuple: of its elements).
fn shape_bytes(shape: &ShapeProto) -> u64 {
    if !shape.tuple_shapes.is_empty() {
        return shape.tuple_shapes.iter().map(shape_bytes).sum();
    }
    let size = element_dtype(shape.element_type).map_or(0, |d| d.size_in_bytes() as u64);
    shape
        .dimensions
        .iter()
        .map(|&d| d.max(0) as u64)
        .product::<u64>()
        * size
}

fn element_dtype(element_type: i32) -> Option<DType> {
    Some(match PrimitiveType::try_from(element_type).ok()? {
        PrimitiveType::Pred => DType::Bool,
        PrimitiveType::S8 => DType::I8,
        PrimitiveType::S16 => DType::I16,
        PrimitiveType::S32 => DType::I32,
        PrimitiveType::S64 => DType::I64,
        PrimitiveType::U8 => DType::U8,
        PrimitiveType::U16 => DType::U16,
        PrimitiveType::U32 => DType::U32,
        PrimitiveType::U64 => DType::U64,
        PrimitiveType::F16 => DType::F16,
        PrimitiveType::Bf16 => DType::BF16,
        PrimitiveType::F32 => DType::F32,
        PrimitiveType::F64 => DType::F64,
        PrimitiveType::C64 => DType::C64,
        PrimitiveType::C128 => DType::C128,
        _ => return None,
    })
}

impl Client {
    /// Compiles a StableHLO module given as MLIR text.
    pub fn compile(&self, stablehlo: &str, options: &CompileOptions) -> Result<LoadedExecutable> {
        // More replicas times partitions than devices makes the plugin
        // allocate per device it does not have (an abort at SIZE_MAX).
        let devices = self.device_count();
        match options.num_replicas.checked_mul(options.num_partitions) {
            Some(n) if n <= devices => {}
            _ => {
                return Err(Error::invalid(
                    "compile options",
                    format!("num_replicas * num_partitions at most the {devices} devices"),
                    format!(
                        "num_replicas={} num_partitions={}",
                        options.num_replicas, options.num_partitions
                    ),
                ))
            }
        }
        let options = options.to_proto_bytes()?;
        let format = "mlir";
        // The plugin's MLIR lexer reads past `code_size` while it lexes an
        // identifier at the very end, until it meets a NUL: give it one
        // just past the text (not counted in `code_size`).
        let mut text = Vec::with_capacity(stablehlo.len() + 1);
        text.extend_from_slice(stablehlo.as_bytes());
        text.push(0);
        let mut program = sys::PJRT_Program::new();
        // PJRT only reads `code` for compilation despite the non-const field.
        program.code = text.as_ptr() as *mut c_char;
        program.code_size = stablehlo.len();
        program.format = format.as_ptr().cast();
        program.format_size = format.len();
        let mut args = sys::PJRT_Client_Compile_Args::new();
        args.client = self.inner.raw;
        args.program = &program;
        args.compile_options = options.as_ptr().cast();
        args.compile_options_size = options.len();
        // SAFETY: the program text (NUL-terminated), format and options
        // outlive the call.
        unsafe { pjrt_call!(self.inner.plugin, PJRT_Client_Compile, &mut args) }?;
        LoadedExecutable::new(self.inner.clone(), args.executable)
    }

    /// Loads an executable serialised by `LoadedExecutable::serialize` with the
    /// same plugin version.
    pub fn deserialize(&self, bytes: &[u8]) -> Result<LoadedExecutable> {
        let mut args = sys::PJRT_Executable_DeserializeAndLoad_Args::new();
        args.client = self.inner.raw;
        args.serialized_executable = bytes.as_ptr().cast();
        args.serialized_executable_size = bytes.len();
        // SAFETY: `bytes` outlives the call.
        unsafe {
            pjrt_call!(
                self.inner.plugin,
                PJRT_Executable_DeserializeAndLoad,
                &mut args
            )
        }?;
        LoadedExecutable::new(self.inner.clone(), args.loaded_executable)
    }
}

impl LoadedExecutable {
    fn new(client: Arc<ClientInner>, raw: *mut PJRT_LoadedExecutable) -> Result<LoadedExecutable> {
        let mut exe = LoadedExecutable {
            client,
            raw,
            devices: Vec::new(),
            num_outputs: 0,
            parameters: None,
            outputs: None,
            output_shardings: None,
            collectives: None,
        };
        let plugin = &exe.client.plugin;
        let mut args = sys::PJRT_LoadedExecutable_AddressableDevices_Args::new();
        args.executable = exe.raw;
        // SAFETY: live executable.
        unsafe { pjrt_call!(plugin, PJRT_LoadedExecutable_AddressableDevices, &mut args) }?;
        if args.num_addressable_devices > 0 {
            // SAFETY: PJRT returns `num_addressable_devices` device pointers
            // owned by the client.
            let raws = unsafe {
                std::slice::from_raw_parts(args.addressable_devices, args.num_addressable_devices)
            };
            exe.devices = raws
                .iter()
                .map(|&raw| Device {
                    client: exe.client.clone(),
                    raw,
                })
                .collect();
        }
        let view = exe.view()?;
        let mut out_args = sys::PJRT_Executable_NumOutputs_Args::new();
        out_args.executable = view.raw;
        // SAFETY: live executable view.
        unsafe { pjrt_call!(exe.client.plugin, PJRT_Executable_NumOutputs, &mut out_args) }?;
        let signature = view.signature(exe.devices.len());
        drop(view);
        exe.parameters = signature.parameters;
        exe.outputs = signature
            .outputs
            .filter(|outputs| outputs.len() == out_args.num_outputs);
        exe.output_shardings = signature.output_shardings;
        exe.collectives = signature.collectives;
        exe.num_outputs = out_args.num_outputs;
        Ok(exe)
    }

    /// The parameter types each device's arguments must have, when known.
    pub fn parameters(&self) -> Option<&[ParameterType]> {
        self.parameters.as_deref()
    }

    /// How an SPMD program lays out each output over its partitions.
    pub fn output_shardings(&self) -> Option<&[Sharding]> {
        self.output_shardings.as_deref()
    }

    /// The collectives of the optimised program, when known.
    pub fn collectives(&self) -> Option<Collectives> {
        self.collectives
    }

    fn view(&self) -> Result<ExecutableView<'_>> {
        let plugin = &self.client.plugin;
        let mut args = sys::PJRT_LoadedExecutable_GetExecutable_Args::new();
        args.loaded_executable = self.raw;
        // SAFETY: live executable.
        unsafe { pjrt_call!(plugin, PJRT_LoadedExecutable_GetExecutable, &mut args) }?;
        Ok(ExecutableView {
            owner: self,
            raw: args.executable,
        })
    }

    /// The devices the executable runs on, one per (replica, partition).
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// Outputs per device.
    pub fn num_outputs(&self) -> usize {
        self.num_outputs
    }

    /// Serialises the executable for `Client::deserialize`.
    pub fn serialize(&self) -> Result<Vec<u8>> {
        let view = self.view()?;
        let mut args = sys::PJRT_Executable_Serialize_Args::new();
        args.executable = view.raw;
        // SAFETY: live executable view.
        unsafe { pjrt_call!(self.client.plugin, PJRT_Executable_Serialize, &mut args) }?;
        let bytes = if args.serialized_bytes.is_null() {
            Vec::new()
        } else {
            // SAFETY: PJRT returns `serialized_bytes_size` bytes backed by
            // `serialized_executable`, freed below.
            unsafe {
                std::slice::from_raw_parts(
                    args.serialized_bytes.cast::<u8>(),
                    args.serialized_bytes_size,
                )
            }
            .to_vec()
        };
        if let Some(deleter) = args.serialized_executable_deleter {
            // SAFETY: the deleter PJRT gave us, called once on its own object.
            unsafe { deleter(args.serialized_executable) };
        }
        Ok(bytes)
    }

    /// Checks count, dtype and shape of one device's arguments against the
    /// program: the CPU plugin accepts any buffer of the right byte size.
    fn check_argument_types<B: Borrow<Buffer>>(&self, device: usize, args: &[B]) -> Result<()> {
        let Some(parameters) = &self.parameters else {
            return Ok(());
        };
        if args.len() != parameters.len() {
            return Err(Error::invalid(
                format!("argument count for device {device}"),
                parameters.len(),
                args.len(),
            ));
        }
        for (i, (buffer, parameter)) in args.iter().zip(parameters).enumerate() {
            let (dtype, dims) = buffer.borrow().shape()?;
            if *dtype != parameter.dtype || *dims != parameter.dims {
                return Err(Error::invalid(
                    format!("argument {i} for device {device}"),
                    format!("{}{:?}", parameter.dtype, parameter.dims),
                    format!("{dtype}{dims:?}"),
                ));
            }
        }
        Ok(())
    }

    /// Runs the program. `args[d]` are the arguments for `devices()[d]`.
    /// Waits for completion and returns `outputs[d]` for each device.
    pub fn execute(
        &self,
        args: &[&[&Buffer]],
        options: &ExecuteOptions,
    ) -> Result<Vec<Vec<Buffer>>> {
        let Execution { outputs, finished } = self.execute_with_events(args, &options.donate)?;
        if !options.asynchronous {
            // Wait for every device, then report the first failure.
            let results: Vec<Result<()>> = finished.iter().flatten().map(Event::wait).collect();
            results.into_iter().collect::<Result<()>>()?;
        }
        Ok(outputs)
    }

    /// Enqueues one execution, donating the argument indices `donate`.
    /// Arguments may be borrowed or shared (`Arc`) buffers, so a caller
    /// holding either needs no vector of references.
    pub(crate) fn execute_with_events<B: Borrow<Buffer>>(
        &self,
        args: &[&[B]],
        donate: &[usize],
    ) -> Result<Execution> {
        let num_devices = self.devices.len();
        if args.len() != num_devices {
            return Err(Error::invalid(
                "argument lists",
                format!("one per device ({num_devices})"),
                args.len(),
            ));
        }
        let num_args = args.first().map_or(0, |a| a.len());
        for (d, device_args) in args.iter().enumerate() {
            if device_args.len() != num_args {
                return Err(Error::invalid(
                    format!("arguments for device {d}"),
                    format!("{num_args} (as for device 0)"),
                    device_args.len(),
                ));
            }
            if let Some(foreign) = device_args
                .iter()
                .position(|b| !Arc::ptr_eq(&b.borrow().client, &self.client))
            {
                return Err(Error::invalid(
                    format!("argument {foreign} for device {d}"),
                    "a buffer of the executable's client",
                    "a buffer of another client",
                ));
            }
            self.check_argument_types(d, device_args)?;
        }
        if let Some(&bad) = donate.iter().find(|&&i| i >= num_args) {
            return Err(Error::invalid(
                "donated argument index",
                format!("less than {num_args}"),
                bad,
            ));
        }
        // The pointer arrays PJRT reads and fills, reused from the last
        // execution on this thread: an eager op made six small vectors here.
        // (A thread being torn down has none to reuse, nor keeps them.)
        let mut arrays = EXECUTE_ARRAYS.try_with(Cell::take).unwrap_or_default();
        let ExecuteArrays {
            non_donatable,
            arg_rows,
            arg_ptrs,
            out_rows,
            out_ptrs,
            events,
        } = &mut arrays;
        non_donatable.clear();
        non_donatable.extend(
            (0..num_args)
                .filter(|i| !donate.contains(i))
                .map(|i| i as i64),
        );
        // Each device's arguments and outputs, row after row in one array.
        arg_rows.clear();
        arg_rows.extend(
            args.iter()
                .flat_map(|row| row.iter().map(|b| b.borrow().raw)),
        );
        arg_ptrs.clear();
        arg_ptrs.extend((0..num_devices).map(|d| arg_rows.as_ptr().wrapping_add(d * num_args)));
        let num_outputs = self.num_outputs;
        out_rows.clear();
        out_rows.resize(num_devices * num_outputs, std::ptr::null_mut());
        let out_base = out_rows.as_mut_ptr();
        out_ptrs.clear();
        out_ptrs.extend((0..num_devices).map(|d| out_base.wrapping_add(d * num_outputs)));
        events.clear();
        events.resize(num_devices, std::ptr::null_mut());

        let mut exec_options = sys::PJRT_ExecuteOptions::new();
        exec_options.non_donatable_input_indices = non_donatable.as_ptr();
        exec_options.num_non_donatable_input_indices = non_donatable.len();
        let mut exec_args = sys::PJRT_LoadedExecutable_Execute_Args::new();
        exec_args.executable = self.raw;
        exec_args.options = &mut exec_options;
        exec_args.argument_lists = arg_ptrs.as_ptr();
        exec_args.num_devices = num_devices;
        exec_args.num_args = num_args;
        exec_args.output_lists = out_ptrs.as_ptr();
        exec_args.device_complete_events = events.as_mut_ptr();
        // SAFETY: every array has the lengths given in the args and outlives
        // the call; PJRT fills `out_rows` and `events`.
        unsafe {
            pjrt_call!(
                self.client.plugin,
                PJRT_LoadedExecutable_Execute,
                &mut exec_args
            )
        }?;

        // Take ownership of every output and event before looking at errors,
        // so nothing leaks when one device fails.
        let outputs: Vec<Vec<Buffer>> = (0..num_devices)
            .map(|d| {
                let row = &out_rows[d * num_outputs..(d + 1) * num_outputs];
                let mut buffers = Vec::with_capacity(num_outputs);
                for (i, &raw) in row.iter().enumerate().filter(|(_, raw)| !raw.is_null()) {
                    let buffer = Buffer::from_raw(self.client.clone(), raw);
                    if let Some(ty) = self.outputs.as_ref().and_then(|o| o.get(i)) {
                        buffer.know_shape(ty.dtype, &ty.dims);
                    }
                    buffers.push(buffer);
                }
                buffers
            })
            .collect();
        let events: Vec<Option<Event>> = events
            .iter()
            .map(|&raw| Event::from_raw(self.client.plugin, raw))
            .collect();
        let _ = EXECUTE_ARRAYS.try_with(|kept| kept.set(arrays));
        Ok(Execution {
            outputs,
            finished: events,
        })
    }
}

impl fmt::Debug for LoadedExecutable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadedExecutable")
            .field("devices", &self.devices.len())
            .field("num_outputs", &self.num_outputs)
            .finish()
    }
}
