//! Element types shared by PyTorch and PJRT.

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// Kinds of dtypes, lowest first as type promotion ranks them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Category {
    Bool,
    Integer,
    Float,
    Complex,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    Bool,
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    F16,
    BF16,
    F32,
    F64,
    C64,
    C128,
}

impl DType {
    pub const ALL: [DType; 15] = [
        DType::Bool,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::C64,
        DType::C128,
    ];

    /// The dtype's kind, as PyTorch's type promotion ranks kinds.
    pub fn category(self) -> Category {
        match self {
            DType::Bool => Category::Bool,
            DType::I8
            | DType::I16
            | DType::I32
            | DType::I64
            | DType::U8
            | DType::U16
            | DType::U32
            | DType::U64 => Category::Integer,
            DType::F16 | DType::BF16 | DType::F32 | DType::F64 => Category::Float,
            DType::C64 | DType::C128 => Category::Complex,
        }
    }

    /// The dtype of a complex dtype's real and imaginary parts; itself for
    /// the others.
    pub fn component(self) -> DType {
        match self {
            DType::C64 => DType::F32,
            DType::C128 => DType::F64,
            other => other,
        }
    }

    /// The complex dtype whose parts are `self`, for float32 and float64.
    pub fn complex_of(self) -> Option<DType> {
        match self {
            DType::F32 => Some(DType::C64),
            DType::F64 => Some(DType::C128),
            _ => None,
        }
    }

    /// Bytes per element in the dense host layout (`bool` is one byte, as in PyTorch).
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::Bool | DType::I8 | DType::U8 => 1,
            DType::I16 | DType::U16 | DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::I64 | DType::U64 | DType::F64 | DType::C64 => 8,
            DType::C128 => 16,
        }
    }

    /// The name used by `Display`/`FromStr` (PyTorch's spelling).
    pub fn as_str(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U8 => "uint8",
            DType::U16 => "uint16",
            DType::U32 => "uint32",
            DType::U64 => "uint64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::C64 => "complex64",
            DType::C128 => "complex128",
        }
    }

    /// The element type as StableHLO spells it inside `tensor<...>`.
    pub fn mlir_name(self) -> &'static str {
        match self {
            DType::Bool => "i1",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "ui8",
            DType::U16 => "ui16",
            DType::U32 => "ui32",
            DType::U64 => "ui64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::C64 => "complex<f32>",
            DType::C128 => "complex<f64>",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DType {
    type Err = Error;

    fn from_str(name: &str) -> Result<DType, Error> {
        DType::ALL
            .into_iter()
            .find(|d| d.as_str() == name)
            .ok_or_else(|| Error::UnknownDType {
                name: name.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for dtype in DType::ALL {
            assert_eq!(dtype.as_str().parse::<DType>().unwrap(), dtype);
        }
        assert!("float8".parse::<DType>().is_err());
    }
}
