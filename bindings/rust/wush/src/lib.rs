//! Safe Rust API of libwush (`include/wush/wush.h`), over the raw declarations of `wush-sys`.
//!
//! - One owning type per handle, released by `Drop`: [`Context`], [`Calibrator`], [`Options`],
//!   [`Transform`], [`QWeight`], [`CheckpointWriter`] / [`Checkpoint`], [`TensorFile`],
//!   [`Linear`]. Where the C API needs one object to outlive another, a lifetime says so (a
//!   [`Linear`] borrows its [`Context`]; a [`CheckpointWriter`] borrows the transforms and
//!   qweights it will write), so handles can be dropped in any order the compiler accepts.
//! - Every failure is an [`Error`] carrying the status and `wush_last_error()`'s message.
//! - Tensors are slices; sizes the C API takes separately are derived from them and checked.
//! - `Send`/`Sync` follow the header's thread rules; each type's documentation says why.
//! - The CPU path needs no `unsafe`. CUDA contexts take device pointers, through the `unsafe`
//!   `*_device` methods only: the safe slice methods refuse a CUDA context.
//!
//! The header is the reference for what each call computes; the method documentation here
//! names the C function it calls.
//!
//! The modules follow the sections of the header; every public item is re-exported here, so the
//! paths are `wush::Context`, `wush::Error`, ... whichever module defines them.

pub use wush_sys as sys;

macro_rules! c_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $var:ident = $c:path),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vm])* $var),* }
        impl $name {
            /// The C value.
            pub fn to_c(self) -> std::os::raw::c_int {
                match self { $($name::$var => $c),* }
            }
            /// The variant of a C value, or None for a value this crate does not know.
            pub fn from_c(v: std::os::raw::c_int) -> Option<$name> {
                $(if v == $c { return Some($name::$var); })*
                None
            }
        }
    };
}

// Handles print as their type and address (their contents live in the library).
macro_rules! debug_handle {
    ($($t:ty),*) => {$(
        impl std::fmt::Debug for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}({:p})", stringify!($t), self.raw.as_ptr())
            }
        }
    )*};
}

mod calibrator;
mod checkpoint;
mod context;
mod error;
mod example_layers;
mod linear;
mod options;
mod qweight;
mod rows;
mod runtime;
mod tensor_file;
mod transform;
mod types;
mod version;

pub use calibrator::{Calibrator, MomentMode};
pub use checkpoint::{Checkpoint, CheckpointMode, CheckpointWriter, LayerPart};
pub use context::{Backend, Context, ContextParameter};
pub use error::{Error, Result, Status};
pub use example_layers::{example_layer, example_layer_names, example_layer_shape, ExampleLayer};
pub use linear::Linear;
pub use options::{OptionId, Options};
pub use qweight::{layer_quantize, Method, QWeight, QWeightInfo};
pub use runtime::CpuIsa;
pub use tensor_file::{Tensor, TensorFile};
pub use transform::{GuardCandidate, GuardReport, GuardScore, GuardSource, Transform, TransformKind, TransformSpec};
pub use types::{Bf16, DType, Element, Format, OutputElement, F16};
pub use version::{check_version, version, version_string};
