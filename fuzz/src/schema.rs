//! The ATen schemas of rtpu's ops (`op_schemas.txt`, written by
//! `gen_op_schemas.py` from the installed torch): what `op_call` reads to
//! build arguments of the right kinds, as the PyTorch shim converts them.
//!
//! rtpu's lowerings read their arguments by position without declaring
//! them, and the shim converts by these very schemas, so they describe
//! exactly the calls rtpu receives in production.

use std::collections::HashMap;
use std::sync::OnceLock;

const SCHEMAS: &str = include_str!("../op_schemas.txt");

/// An argument's base type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Base {
    Tensor,
    /// `Scalar`: an int, float or bool.
    Scalar,
    /// `int` or `SymInt`.
    Int,
    Float,
    Bool,
    Str,
    ScalarType,
    Generator,
    Layout,
    MemoryFormat,
    Device,
}

/// One schema argument, e.g. `int[2] stride=[1, 1]` or `Tensor?[] indices`.
#[derive(Clone, Debug)]
pub struct Param {
    pub name: String,
    pub base: Base,
    /// `T?`: None is valid.
    pub optional: bool,
    /// `T[]` or `T[n]`: a list, of `n` elements when fixed.
    pub list: Option<Option<usize>>,
    /// `T?[]`: a list whose elements may be None.
    pub optional_elements: bool,
    /// Written by the op (`Tensor(a!)`).
    pub writes: bool,
    /// The default as written in the schema (`[1, 1]`, `"mean"`, `None`).
    pub default: Option<String>,
}

/// One op: its schema name and arguments.
#[derive(Debug)]
pub struct OpSchema {
    pub name: String,
    pub params: Vec<Param>,
}

/// The schemas by op name.
pub fn schemas() -> &'static HashMap<String, OpSchema> {
    static TABLE: OnceLock<HashMap<String, OpSchema>> = OnceLock::new();
    TABLE.get_or_init(|| {
        SCHEMAS
            .lines()
            .filter(|line| !line.starts_with('#') && !line.is_empty())
            .map(|line| {
                let mut fields = line.split('\t');
                let name = fields.next().unwrap_or_default().to_string();
                let params = fields
                    .map(|arg| parse_param(arg).unwrap_or_else(|| panic!("bad argument {arg:?}")))
                    .collect();
                (name.clone(), OpSchema { name, params })
            })
            .collect()
    })
}

fn parse_param(text: &str) -> Option<Param> {
    let (decl, default) = match text.split_once('=') {
        Some((decl, default)) => (decl, Some(default.to_string())),
        None => (text, None),
    };
    let (ty, name) = decl.rsplit_once(' ')?;
    // The alias annotation: `Tensor(a!)`, `Tensor(a!)[]`.
    let writes = ty.contains('!');
    let ty = match (ty.find('('), ty.find(')')) {
        (Some(open), Some(close)) => format!("{}{}", &ty[..open], &ty[close + 1..]),
        _ => ty.to_string(),
    };
    let (ty, optional) = match ty.strip_suffix('?') {
        Some(inner) => (inner.to_string(), true),
        None => (ty, false),
    };
    let (element, list) = match ty.find('[') {
        Some(open) => {
            let len = ty[open + 1..ty.len() - 1].parse().ok();
            (&ty[..open], Some(len))
        }
        None => (ty.as_str(), None),
    };
    let (element, optional_elements) = match element.strip_suffix('?') {
        Some(inner) => (inner, true),
        None => (element, false),
    };
    let base = match element {
        "Tensor" => Base::Tensor,
        "Scalar" => Base::Scalar,
        "int" | "SymInt" => Base::Int,
        "float" => Base::Float,
        "bool" => Base::Bool,
        "str" => Base::Str,
        "ScalarType" => Base::ScalarType,
        "Generator" => Base::Generator,
        "Layout" => Base::Layout,
        "MemoryFormat" => Base::MemoryFormat,
        "Device" => Base::Device,
        _ => return None,
    };
    Some(Param {
        name: name.to_string(),
        base,
        optional,
        list,
        optional_elements,
        writes,
        default,
    })
}

impl Param {
    /// The default as an int list (`[1, 1]`, or one int repeated to the
    /// list's length as ATen does for `int[2] dilation=1`).
    pub fn default_ints(&self) -> Option<Vec<i64>> {
        let text = self.default.as_deref()?;
        if let Some(inner) = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
            return inner
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| s.parse().ok())
                .collect();
        }
        let value: i64 = text.parse().ok()?;
        Some(vec![value; self.list.flatten().unwrap_or(1)])
    }

    /// The default as a number, when it is one.
    pub fn default_number(&self) -> Option<f64> {
        self.default.as_deref()?.parse().ok()
    }

    /// The default string without its quotes.
    pub fn default_str(&self) -> Option<&str> {
        let text = self.default.as_deref()?;
        text.strip_prefix('"')
            .and_then(|t| t.strip_suffix('"'))
            .or_else(|| text.strip_prefix('\'').and_then(|t| t.strip_suffix('\'')))
    }
}
