//! Raw PJRT C API bindings, generated at build time from the plugin package's
//! `pjrt_c_api.h` (see `core/build.rs`).

#![allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code
)]
#![allow(clippy::all, clippy::undocumented_unsafe_blocks)]

include!(concat!(env!("OUT_DIR"), "/pjrt_bindings.rs"));

/// PJRT args structs: zeroed, with `struct_size` set to this build's size.
pub(crate) trait Args: Default {
    fn new() -> Self;
}

macro_rules! args_structs {
    ($($t:ident),* $(,)?) => {
        $(impl Args for $t {
            fn new() -> Self {
                $t { struct_size: std::mem::size_of::<$t>(), ..Default::default() }
            }
        })*
    };
}

args_structs!(
    PJRT_Error_Message_Args,
    PJRT_Error_GetCode_Args,
    PJRT_Error_Destroy_Args,
    PJRT_Plugin_Initialize_Args,
    PJRT_Event_Await_Args,
    PJRT_Event_IsReady_Args,
    PJRT_Event_OnReady_Args,
    PJRT_Event_Destroy_Args,
    PJRT_NamedValue,
    PJRT_Client_Create_Args,
    PJRT_Client_Destroy_Args,
    PJRT_Client_PlatformName_Args,
    PJRT_Client_PlatformVersion_Args,
    PJRT_Client_AddressableDevices_Args,
    PJRT_Client_Devices_Args,
    PJRT_Client_ProcessIndex_Args,
    PJRT_Client_BufferFromHostBuffer_Args,
    PJRT_Client_Compile_Args,
    PJRT_Device_GetDescription_Args,
    PJRT_Device_MemoryStats_Args,
    PJRT_DeviceDescription_Attributes_Args,
    PJRT_DeviceDescription_Id_Args,
    PJRT_DeviceDescription_Kind_Args,
    PJRT_DeviceDescription_ToString_Args,
    PJRT_Buffer_Destroy_Args,
    PJRT_Buffer_ElementType_Args,
    PJRT_Buffer_Dimensions_Args,
    PJRT_Buffer_OnDeviceSizeInBytes_Args,
    PJRT_Buffer_Device_Args,
    PJRT_Buffer_IsDeleted_Args,
    PJRT_Buffer_ReadyEvent_Args,
    PJRT_Buffer_ToHostBuffer_Args,
    PJRT_Buffer_CopyToDevice_Args,
    PJRT_Buffer_CopyRawToHost_Args,
    PJRT_Buffer_GetMemoryLayout_Args,
    PJRT_Program,
    PJRT_ExecuteOptions,
    PJRT_LoadedExecutable_Execute_Args,
    PJRT_LoadedExecutable_Destroy_Args,
    PJRT_LoadedExecutable_AddressableDevices_Args,
    PJRT_LoadedExecutable_GetExecutable_Args,
    PJRT_Executable_Destroy_Args,
    PJRT_Executable_NumOutputs_Args,
    PJRT_Executable_OptimizedProgram_Args,
    PJRT_Executable_Serialize_Args,
    PJRT_Executable_DeserializeAndLoad_Args,
);
