//! The macros that declare op table entries: each expands one schema
//! name, or a family of overloads (`.out`, in place, backward), into
//! `OpDef`s whose names are built by `concat!` and whose lowering calls the
//! family's function with its typed kind and `Form` or `Pass`.

/// One table entry: `op!("aten::mm", mm())` lowers with `mm(b)`,
/// `op!("aten::amax", amax_amin(ReduceOp::Max))` with
/// `amax_amin(b, ReduceOp::Max)`.
/// The non-capturing closure coerces to `OpDef::lower`'s fn pointer.
macro_rules! op {
    ($name:expr, $f:ident($($arg:expr),* $(,)?)) => {
        $crate::ops::OpDef {
            name: $name,
            lower: |b| $f(b $(, $arg)*),
        }
    };
}

/// Several names lowered alike by `f(b, args..)`.
macro_rules! aliases {
    ([$($name:expr),+ $(,)?], $f:ident $args:tt) => {
        [$(op!($name, $f $args)),+]
    };
}

/// `name` and `name.out`, both lowered by `f(b, args..)`.
macro_rules! with_out {
    ($name:literal, $f:ident $args:tt) => {
        [op!($name, $f $args), op!(concat!($name, ".out"), $f $args)]
    };
}

/// `name`, `name.out` (functional) and `name_` (in place), lowered by
/// `f(b, args.., form)`.
macro_rules! forms {
    ($name:literal, $f:ident($($arg:expr),* $(,)?)) => {
        [
            op!($name, $f($($arg,)* $crate::ops::Form::Functional)),
            op!(concat!($name, ".out"), $f($($arg,)* $crate::ops::Form::Functional)),
            op!(concat!($name, "_"), $f($($arg,)* $crate::ops::Form::InPlace)),
        ]
    };
}

/// `name` and `name.out`, lowered by `f(b, args.., Pass::Forward)`, and
/// `name_backward` and `name_backward.grad_input`, by
/// `f(b, args.., Pass::Backward)`.
macro_rules! with_backward {
    ($name:literal, $f:ident($($arg:expr),* $(,)?)) => {
        [
            op!($name, $f($($arg,)* $crate::ops::Pass::Forward)),
            op!(concat!($name, ".out"), $f($($arg,)* $crate::ops::Pass::Forward)),
            op!(concat!($name, "_backward"), $f($($arg,)* $crate::ops::Pass::Backward)),
            op!(
                concat!($name, "_backward.grad_input"),
                $f($($arg,)* $crate::ops::Pass::Backward)
            ),
        ]
    };
}

/// `name_backward` and `name_backward.grad_input`, lowered by
/// `f(b, args..)`.
macro_rules! backward_of {
    ($name:literal, $f:ident $args:tt) => {
        [
            op!(concat!($name, "_backward"), $f $args),
            op!(concat!($name, "_backward.grad_input"), $f $args),
        ]
    };
}

/// Per overload `o`: `name.o` and `name.o_out` (functional) and `name_.o`
/// (in place), lowered by `f(b, args.., form)`.
macro_rules! overloads {
    ($name:literal, [$($o:literal),+], $f:ident $args:tt) => {
        [$(
            form_entry!(concat!($name, ".", $o), Functional, $f $args),
            form_entry!(concat!($name, ".", $o, "_out"), Functional, $f $args),
            form_entry!(concat!($name, "_.", $o), InPlace, $f $args),
        )+]
    };
}

/// Per overload `o`: `name.o` and `name.o_out`, lowered by `f(b, args..)`.
macro_rules! out_overloads {
    ($name:literal, [$($o:literal),+], $f:ident $args:tt) => {
        [$(
            op!(concat!($name, ".", $o), $f $args),
            op!(concat!($name, ".", $o, "_out"), $f $args),
        )+]
    };
}

/// One entry lowered by `f(b, args.., Form::form)`.
macro_rules! form_entry {
    ($name:expr, $form:ident, $f:ident($($arg:expr),* $(,)?)) => {
        op!($name, $f($($arg,)* $crate::ops::Form::$form))
    };
}

#[cfg(test)]
mod tests {
    use crate::ops::table;

    #[test]
    fn entry_macros_spell_schema_names() {
        let names: Vec<&str> = table().iter().map(|op| op.name).collect();
        for name in [
            "aten::sin",
            "aten::sin.out",
            "aten::sin_",
            "aten::remainder.Scalar",
            "aten::remainder.Scalar_out",
            "aten::remainder_.Scalar",
            "aten::eq.Tensor_out",
            "aten::add_.Tensor",
            "aten::upsample_bilinear2d_backward.grad_input",
            "aten::_foreach_add_.List",
        ] {
            assert!(names.contains(&name), "{name} is not registered");
        }
        assert!(
            !names.contains(&"aten::eq_.Tensor"),
            "comparisons have no in-place entry"
        );
        assert!(!names.contains(&"aten::_foreach_sub.Tensor"));
    }
}
