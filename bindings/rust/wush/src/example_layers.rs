//! Built-in example layers (`wush.h`: "Built-in example layers"), the default data of `wush eval`.

use crate::error::{c_string, check, checked_alloc, static_str, Result};
use crate::sys;

/// A built-in example layer ([`example_layer`]).
pub struct ExampleLayer {
    pub d_out: usize,
    pub d_in: usize,
    /// d_out x d_in.
    pub weight: Vec<f32>,
    /// n_calibration x d_in.
    pub calibration: Vec<f32>,
    /// n_heldout x d_in.
    pub heldout: Vec<f32>,
}

/// `wush_example_layer_count` + `wush_example_layer_name`: the built-in layer names.
pub fn example_layer_names() -> Vec<&'static str> {
    // SAFETY: static names for every index below the count.
    let n = unsafe { sys::wush_example_layer_count() };
    (0..n).filter_map(|i| unsafe { static_str(sys::wush_example_layer_name(i)) }).collect()
}

/// `wush_example_layer_shape`: (d_out, d_in).
pub fn example_layer_shape(name: &str) -> Result<(usize, usize)> {
    let c = c_string(name, "layer name")?;
    let (mut o, mut i) = (0, 0);
    // SAFETY: valid string and output pointers.
    check(unsafe { sys::wush_example_layer_shape(c.as_ptr(), &mut o, &mut i) })?;
    Ok((o, i))
}

/// `wush_example_layer_generate`: the named layer's weight and activations, from `seed`.
pub fn example_layer(name: &str, seed: u64, n_calibration: usize, n_heldout: usize) -> Result<ExampleLayer> {
    let (d_out, d_in) = example_layer_shape(name)?;
    let c = c_string(name, "layer name")?;
    // Every size checked before anything is allocated.
    let n_weight = checked_alloc::<f32>(d_out, d_in, "weight")?;
    let n_calibration_elems = checked_alloc::<f32>(n_calibration, d_in, "calibration tokens")?;
    let n_heldout_elems = checked_alloc::<f32>(n_heldout, d_in, "held-out tokens")?;
    let mut l = ExampleLayer { d_out, d_in, weight: vec![0.0; n_weight], calibration: vec![0.0; n_calibration_elems],
                               heldout: vec![0.0; n_heldout_elems] };
    // SAFETY: every buffer holds the count passed.
    check(unsafe {
        sys::wush_example_layer_generate(c.as_ptr(), seed, n_calibration, n_heldout, l.weight.as_mut_ptr(),
                                         l.weight.len(), l.calibration.as_mut_ptr(), l.calibration.len(),
                                         l.heldout.as_mut_ptr(), l.heldout.len())
    })?;
    Ok(l)
}
